"""tests/lib/stf32.py: the safetensors file as tests read and edit it
(stdlib and numpy only): its header, its F32 tensors as arrays, and an F32
file written from arrays (sorted names, 8-byte aligned header)."""
import json
import struct

import numpy as np


def header(path):
    """The JSON header of the safetensors file PATH (with __metadata__)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def read(path):
    """Every tensor of PATH, which must all be F32, as writable arrays."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (path, k, v["dtype"])
        lo, hi = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + lo:8 + n + hi], "<f4").reshape(v["shape"]).copy()
    return out


def write(path, ts):
    """Write the arrays TS (name -> array) to PATH as F32 tensors."""
    hd, off, blobs = {}, 0, []
    for k in sorted(ts):
        a = np.ascontiguousarray(ts[k], "<f4")
        hd[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        blobs.append(a.tobytes())
    j = json.dumps(hd).encode()
    j += b" " * (-len(j) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(j)) + j + b"".join(blobs))
