#!/usr/bin/env python3
"""tests/lib/peer_fp8.py: read an FP8 checkpoint directory as the peers'
loaders do (transformers' and vLLM's "fp8" method with weight blocks, and
the "compressed-tensors" float-quantized layout), from the safetensors
headers and config.json alone, and say whether they load it.

    peer_fp8.py DIR     exit 0: loadable, one line saying how;
                        exit 1: one line per reason it is not

What the peers take, as their documentation and loaders state it:
- only nn.Linear modules of the decoder are quantized (q, k, v, o, gate, up,
  down projections); the embedding, lm_head and norms stay BF16/F16/F32
  (vLLM's fp8 method quantizes LinearBase layers only, its lm_head is a
  vocabulary embedding; transformers keeps lm_head out by default);
- "fp8": quantization_config {quant_method "fp8", fmt "e4m3",
  activation_scheme "dynamic"|"static", weight_block_size [bn, bk],
  modules_to_not_convert}; each F8_E4M3 "X.weight" (N, K) has
  "X.weight_scale_inv" of shape (ceil(N/bn), ceil(K/bk)), float;
- "compressed-tensors": format "float-quantized", config_groups whose
  weights are {num_bits 8, type "float", strategy "tensor"|"channel"},
  "ignore"; each F8_E4M3 "X.weight" (N, K) has "X.weight_scale" of one
  element (tensor) or shape (N, 1) (channel), and "X.input_scale" of one
  element exactly when the input activations are static;
- every decoder linear not listed as left plain is F8_E4M3 (the loader
  makes an FP8 parameter for it), and nothing listed is.
A file marked "llm_tools_fp8_vocab" (llm-quantize --fp8-vocab) is reported
as ours alone, with the reason.
"""
import json
import math
import os
import re
import struct
import sys

LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.weight$")
FLOAT = {"F32", "F16", "BF16"}


def headers(d):
    names = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    if not names:
        raise SystemExit(f"{d}: no .safetensors file")
    out = {}
    for n in names:
        with open(os.path.join(d, n), "rb") as f:
            h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        h.pop("__metadata__", None)
        out.update(h)
    return out


def module(name):
    return name[: -len(".weight")] if name.endswith(".weight") else name


def listed(mods, name):
    """transformers and vLLM match a module against the list by name or
    by a listed name being part of it ("lm_head", "model.layers.0.mlp")"""
    m = module(name)
    return any(m == x or m.startswith(x + ".") or x in m.split(".") for x in mods)


def check(d):
    bad = []
    cfg = json.load(open(os.path.join(d, "config.json")))
    q = cfg.get("quantization_config")
    if not isinstance(q, dict):
        return ["config.json: no quantization_config"], None
    t = headers(d)
    method = q.get("quant_method")
    if "llm_tools_fp8_vocab" in q:
        bad.append(f"quantization_config.llm_tools_fp8_vocab {q['llm_tools_fp8_vocab']}: "
                   "an FP8 embedding or lm_head, which only llm-tools load")
    if method == "fp8":
        if q.get("fmt") != "e4m3":
            bad.append(f"fmt {q.get('fmt')!r} is not 'e4m3'")
        if q.get("activation_scheme") not in ("dynamic", "static"):
            bad.append(f"activation_scheme {q.get('activation_scheme')!r}")
        b = q.get("weight_block_size")
        if not (isinstance(b, list) and len(b) == 2 and all(isinstance(x, int) and x > 0 for x in b)):
            bad.append(f"weight_block_size {b!r}: the block layout needs [bn, bk] (without it the "
                       "fp8 loaders expect one weight_scale per tensor)")
            b = None
        plain = q.get("modules_to_not_convert") or []
        scale_suffix, how = "_scale_inv", f"fp8 blocks {b}"
    elif method == "compressed-tensors":
        if q.get("format") != "float-quantized":
            bad.append(f"format {q.get('format')!r} is not 'float-quantized'")
        groups = q.get("config_groups") or {}
        if len(groups) != 1:
            return bad + [f"config_groups: {len(groups)} groups (this check reads one)"], None
        g = next(iter(groups.values()))
        w, a = g.get("weights") or {}, g.get("input_activations")
        if w.get("num_bits") != 8 or w.get("type") != "float":
            bad.append(f"weights {w}: not 8-bit float")
        strategy = w.get("strategy")
        if strategy not in ("tensor", "channel"):
            bad.append(f"weights.strategy {strategy!r}")
        if "Linear" not in (g.get("targets") or []):
            bad.append(f"targets {g.get('targets')!r} do not name Linear")
        static_in = bool(a) and not a.get("dynamic", False)
        plain = q.get("ignore") or []
        scale_suffix, how = "_scale", f"compressed-tensors {strategy}"
        b = None
    else:
        return bad + [f"quant_method {method!r} is neither 'fp8' nor 'compressed-tensors'"], None
    if not listed(plain, "lm_head.weight"):
        bad.append(f"lm_head is not among the modules left plain ({plain})")
    n_fp8 = 0
    for name, h in sorted(t.items()):
        if h["dtype"] == "F8_E4M3":
            n_fp8 += 1
            if not LINEAR.match(name):
                bad.append(f"{name}: F8_E4M3, but the peers quantize decoder linears only")
                continue
            if listed(plain, name):
                bad.append(f"{name}: F8_E4M3, but listed as left plain")
            n, k = h["shape"]
            s = t.get(name + scale_suffix)
            if s is None:
                bad.append(f"{name}: no {name + scale_suffix}")
                continue
            if s["dtype"] not in FLOAT:
                bad.append(f"{name + scale_suffix}: dtype {s['dtype']}")
            if method == "fp8" and b:
                want = [math.ceil(n / b[0]), math.ceil(k / b[1])]
            elif method == "compressed-tensors" and strategy == "channel":
                want = [n, 1]
            else:
                want = None
            if want is not None and s["shape"] != want:
                bad.append(f"{name + scale_suffix}: shape {s['shape']}, the loader expects {want}")
            if want is None and math.prod(s["shape"]) != 1:
                bad.append(f"{name + scale_suffix}: shape {s['shape']}, one scale expected")
            if method == "compressed-tensors":
                i = t.get(name[: -len("weight")] + "input_scale")
                if static_in and (i is None or math.prod(i["shape"]) != 1):
                    bad.append(f"{name}: static input activations without a one-element input_scale")
                if not static_in and i is not None:
                    bad.append(f"{name}: an input_scale with dynamic input activations")
            if method == "fp8" and (name + "_scale") in t:
                bad.append(f"{name}_scale beside {name}_scale_inv")
        elif LINEAR.match(name) and not listed(plain, name):
            bad.append(f"{name}: {h['dtype']}, not listed as left plain: the loader makes an FP8 "
                       "parameter for it")
        elif name.endswith(("_scale", "_scale_inv")) and t.get(re.sub(r"_scale(_inv)?$", "", name), {}).get("dtype") != "F8_E4M3":
            if not name.endswith("input_scale"):
                bad.append(f"{name}: a scale of no F8_E4M3 weight")
        elif "embed_tokens" in name or name.startswith("lm_head") or "norm" in name:
            if h["dtype"] not in FLOAT:
                bad.append(f"{name}: dtype {h['dtype']}, the peers keep it BF16")
    if n_fp8 == 0:
        bad.append("no F8_E4M3 tensor")
    return bad, f"{how}, {n_fp8} FP8 linears, left plain {plain}"


def main():
    if len(sys.argv) != 2:
        print("usage: peer_fp8.py DIR", file=sys.stderr)
        return 2
    bad, how = check(sys.argv[1])
    for b in bad:
        print(f"{sys.argv[1]}: {b}")
    if not bad:
        print(f"{sys.argv[1]}: loadable: {how}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
