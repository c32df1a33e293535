#!/usr/bin/env python3
"""Write tests/data/malformed/*.safetensors: one file per way a safetensors
file can be wrong. Each must be refused with exit 1 and a one-line error
naming the file. Run from this directory; the output is committed."""
import json, os, struct

out = "malformed"
os.makedirs(out, exist_ok=True)

def st(header, data=b"", hlen=None):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data

good = {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]}}
data = bytes(range(24))
cases = {
    "empty": b"",
    "short-length": b"\x05\x00\x00",
    "truncated-header": st(good, data)[:20],
    "truncated-data": st(good, data)[:-5],
    "header-beyond-file": st(good, data, hlen=10**6),
    "header-too-large": st(good, data, hlen=2**40),
    "not-json": struct.pack("<Q", 8) + b"{not js}" + data,
    "json-array": st([1, 2, 3]),
    "bad-utf8": struct.pack("<Q", 10) + b'{"\xff\xfe":1}' + data,
    "overlap": st({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                   "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, data),
    "gap": st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}}, data),
    "trailing-data": st({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, data),
    "unknown-dtype": st({"a": {"dtype": "F33", "shape": [6], "data_offsets": [0, 24]}}, data),
    "shape-size-mismatch": st({"a": {"dtype": "F32", "shape": [5], "data_offsets": [0, 24]}}, data),
    "offsets-beyond-data": st({"a": {"dtype": "U8", "shape": [100], "data_offsets": [0, 100]}}, data),
    "offsets-reversed": st({"a": {"dtype": "U8", "shape": [0], "data_offsets": [24, 0]}}, data),
    "negative-dim": st({"a": {"dtype": "U8", "shape": [-24], "data_offsets": [0, 24]}}, data),
    "shape-overflow": st({"a": {"dtype": "F32", "shape": [2**31, 2**31, 2**31, 8], "data_offsets": [0, 24]}}, data),
    "bytes-overflow": st({"a": {"dtype": "F64", "shape": [2**61 + 3], "data_offsets": [0, 24]}}, data),
    "missing-offsets": st({"a": {"dtype": "U8", "shape": [24]}}, data),
    "string-shape": st({"a": {"dtype": "U8", "shape": "24", "data_offsets": [0, 24]}}, data),
    "metadata-not-strings": st({"__metadata__": {"format": 1},
                                "a": {"dtype": "U8", "shape": [24], "data_offsets": [0, 24]}}, data),
}
# duplicate names need a hand-written header (json.dumps cannot make one)
h = b'{"a":{"dtype":"U8","shape":[12],"data_offsets":[0,12]},"a":{"dtype":"U8","shape":[12],"data_offsets":[12,24]}}'
cases["duplicate-name"] = struct.pack("<Q", len(h)) + h + data
for name, blob in cases.items():
    with open(os.path.join(out, name + ".safetensors"), "wb") as f:
        f.write(blob)
print(len(cases), "files")
