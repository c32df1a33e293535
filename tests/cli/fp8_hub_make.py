#!/usr/bin/python3
"""tests/cli/fp8_hub_make.py: FP8 checkpoints in the layouts found on the
Hugging Face Hub, written here from a plain F32 checkpoint (llm-quantize
--random --dtype f32), each with its reference: the same weights
dequantized to F32, for tests/cli/fp8_hub.sh.

    fp8_hub_make.py LAYOUT SRC OUT REF     write OUT (FP8) and REF (F32)
    fp8_hub_make.py --compare A B          every tensor of A equals B's
                                           (values, not dtypes); exit 1 if not

LAYOUT, as the tools that write them lay them out (their documentation):
  ct-tensor   compressed-tensors, float-quantized, strategy "tensor": one
              BF16 weight_scale of shape [] per linear, static per-tensor
              input_scale of shape [] (llm-compressor's FP8 scheme)
  ct-channel  compressed-tensors, strategy "channel": weight_scale
              (d_out, 1) BF16, static per-tensor input_scale
  fbgemm      quant_method "fbgemm_fp8": weight_scale (d_out, 1) F32 per row,
              activation_scale_ub, modules_to_not_convert naming lm_head and
              layer 0's attention projections, which stay BF16 (Meta's
              Llama 3.1 405B FP8 keeps some layers unquantized so)
  block-bf16  quant_method "fp8", weight_block_size [128, 128],
              weight_scale_inv BF16
  block-f32   the same with F32 scales (what llm-quantize writes)
The decoder linears (q, k, v, o, gate, up, down) are FP8 E4M3; embedding,
norms and lm_head BF16. Every scale is a power of two (2^ceil(log2(amax /
448))), so code x scale is exact in F32 and in BF16 and REF holds exactly
the values an FP8 reader must compute; the linears are first multiplied by
powers of two by row and by block, so the scales differ from block to
block and row to row and a scale read at the wrong place shows. Codes are
the nearest E4M3 value, ties to the even code.
"""
import json
import math
import os
import re
import shutil
import struct
import sys

import numpy as np

LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.weight$")
DT = {"F32": (np.float32, 4), "BF16": (np.uint16, 2), "F8_E4M3": (np.uint8, 1)}


def e4m3_decode(codes):
    c = codes.astype(np.int32)
    s = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 15
    m = c & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))
    v = np.where((c & 0x7F) == 0x7F, np.nan, v)
    return (s * v).astype(np.float32)


POS = e4m3_decode(np.arange(127, dtype=np.uint8)).astype(np.float64)   # codes 0..126, ascending


def e4m3_encode(x):
    """nearest E4M3 code, ties to the even code, |x| <= 448 (the scales
    make it so)"""
    a = np.abs(x.astype(np.float64))
    hi = np.clip(np.searchsorted(POS, a), 1, 126)
    lo = hi - 1
    dlo, dhi = a - POS[lo], POS[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (code | np.where(x < 0, 0x80, 0)).astype(np.uint8)


def bf16_bits(x):
    """round to nearest even; X any shape, 0-d included"""
    x = np.asarray(x, np.float32)
    u = x.reshape(-1).view(np.uint32).astype(np.uint64)
    r = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return r.astype(np.uint16).reshape(x.shape)


def bf16_value(bits):
    b = np.asarray(bits)
    return (b.reshape(-1).astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(b.shape)


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        base = 8 + n
        meta = h.pop("__metadata__", {})
        out = {}
        for k, v in h.items():
            dt, sz = DT[v["dtype"]]
            b, e = v["data_offsets"]
            f.seek(base + b)
            a = np.frombuffer(f.read(e - b), dtype=dt).reshape(v["shape"])
            out[k] = (v["dtype"], a)
    return out, meta


def value(dtype, a):
    if dtype == "BF16":
        return bf16_value(a)
    if dtype == "F8_E4M3":
        return e4m3_decode(a)
    return a.astype(np.float32)


def write(path, tensors):
    """tensors: name -> (dtype, array of the stored bits)"""
    h, off, blobs = {}, 0, []
    for k, (dt, a) in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        h[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h["__metadata__"] = {"format": "pt"}
    js = json.dumps(h, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js)
        for b in blobs:
            f.write(b)


def pow2_scale(amax):
    amax = np.asarray(amax, dtype=np.float64)
    e = np.ceil(np.log2(np.where(amax > 0, amax, 1.0) / 448.0))
    return np.where(amax > 0, 2.0 ** e, 0.0).astype(np.float32)


def quantize(w, bn, bk):
    """codes and scales of W (N, K) in bn x bk blocks (partial at the edges)"""
    n, k = w.shape
    sr, sc = math.ceil(n / bn), math.ceil(k / bk)
    scale = np.zeros((sr, sc), np.float32)
    codes = np.zeros((n, k), np.uint8)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            s = pow2_scale(np.abs(blk).max())
            scale[i, j] = s
            if s > 0:
                codes[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = e4m3_encode(blk / s)
    full = np.repeat(np.repeat(scale, bn, 0), bk, 1)[:n, :k]
    return codes, scale, e4m3_decode(codes) * full


def make(layout, src, out, ref):
    st, _ = read(os.path.join(src, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    fx, rf = {}, {}
    plain = ["lm_head"]
    if layout == "fbgemm":
        plain += [f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"]
    for name, (dt, a) in st.items():
        w = value(dt, a)
        mod = name[: -len(".weight")]
        if not LINEAR.match(name) or mod in plain:
            b = bf16_bits(w)
            fx[name] = ("BF16", b)
            rf[name] = ("F32", bf16_value(b))
            continue
        n, k = w.shape
        # powers of two by row and by 128 x 128 block, so that the scales
        # differ (the random weights alone would give one scale everywhere)
        r, c = np.arange(n)[:, None], np.arange(k)[None, :]
        w = w * 2.0 ** ((r % 3) - 1 + ((r // 128) + 2 * (c // 128)) % 3 - 1)
        if layout == "ct-tensor":
            codes, s, deq = quantize(w, n, k)
            fx[name] = ("F8_E4M3", codes)
            fx[mod + ".weight_scale"] = ("BF16", bf16_bits(s.reshape(())))
        elif layout in ("ct-channel", "fbgemm"):
            codes, s, deq = quantize(w, 1, k)
            fx[name] = ("F8_E4M3", codes)
            fx[mod + ".weight_scale"] = ("BF16", bf16_bits(s)) if layout == "ct-channel" else ("F32", s)
        else:
            codes, s, deq = quantize(w, 128, 128)
            fx[name] = ("F8_E4M3", codes)
            fx[mod + ".weight_scale_inv"] = ("BF16", bf16_bits(s)) if layout == "block-bf16" else ("F32", s)
        if layout.startswith("ct-"):   # a static activation scale, as a calibrated file has
            fx[mod + ".input_scale"] = ("BF16", bf16_bits(np.array(0.0625, np.float32).reshape(())))
        rf[name] = ("F32", deq)
    if layout.startswith("ct-"):
        act = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False,
               "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax",
               "observer_kwargs": {}}
        wq = dict(act, strategy="tensor" if layout == "ct-tensor" else "channel")
        q = {"quant_method": "compressed-tensors", "format": "float-quantized",
             "quantization_status": "compressed", "ignore": plain, "kv_cache_scheme": None,
             "config_groups": {"group_0": {"targets": ["Linear"], "weights": wq, "input_activations": act,
                                           "output_activations": None}}}
    elif layout == "fbgemm":
        q = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": plain}
    elif layout in ("block-bf16", "block-f32"):
        q = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
             "weight_block_size": [128, 128], "modules_to_not_convert": plain}
    else:
        raise SystemExit(f"fp8_hub_make.py: unknown layout {layout}")
    for d, tensors, c in ((out, fx, dict(cfg, quantization_config=q, torch_dtype="bfloat16")),
                          (ref, rf, dict(cfg, torch_dtype="float32"))):
        os.makedirs(d, exist_ok=True)
        c.pop("quantization_config", None) if d == ref else None
        write(os.path.join(d, "model.safetensors"), tensors)
        json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)
        for f in os.listdir(src):
            if f not in ("model.safetensors", "config.json") and not f.endswith(".safetensors"):
                shutil.copy(os.path.join(src, f), d)


def compare(a, b):
    ta, _ = read(os.path.join(a, "model.safetensors") if os.path.isdir(a) else a)
    tb, _ = read(os.path.join(b, "model.safetensors") if os.path.isdir(b) else b)
    bad = [k for k in tb if k not in ta] + [k for k in ta if k not in tb]
    for k in tb:
        if k in ta:
            va, vb = value(*ta[k]), value(*tb[k])
            if va.shape != vb.shape or not np.array_equal(va, vb):
                bad.append(k)
    for k in bad[:5]:
        print(f"{a}: tensor {k} differs from {b}'s")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    make(*sys.argv[1:])
