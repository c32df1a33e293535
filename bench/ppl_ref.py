#!/usr/bin/env python3
"""bench/ppl_ref.py: the perplexity of a token sequence under the independent
float64 forward of ../shared/tools/hfref.py, to set beside llm-generate
--perplexity on the same ids (whether a perplexity change comes from the
weights or from the engine).

usage: ppl_ref.py HF_DIR IDS.json   (IDS.json: a JSON array of token ids, as
       llm-generate --tokenize prints; the first is context only)
HF_DIR: one model.safetensors, F32 or BF16 (an FP8 checkpoint goes through
llm-quantize --dequantize --dtype f32 first: the FP8 values exactly).
LLM_TEST_TOOLS (default ../shared/tools) is where hfref.py is found.
Prints: HF_DIR, scored tokens, total negative log-likelihood and perplexity.
"""
import json, os, sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("LLM_TEST_TOOLS", os.path.join(here, "..", "..", "shared", "tools")))
import numpy as np  # noqa: E402
import hfref  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: ppl_ref.py HF_DIR IDS.json")
    d, path = sys.argv[1], sys.argv[2]
    ids = json.load(open(path))
    if not isinstance(ids, list) or len(ids) < 2 or not all(isinstance(i, int) for i in ids):
        sys.exit(f"{path}: not a JSON array of two or more token ids")
    lo = hfref.forward(d, ids)
    lo = lo - lo.max(-1, keepdims=True)
    lp = lo - np.log(np.exp(lo).sum(-1, keepdims=True))
    nll = -sum(float(lp[t, ids[t + 1]]) for t in range(len(ids) - 1))
    n = len(ids) - 1
    print(f"{d} tokens {n} nll {nll:.6f} ppl {np.exp(nll / n):.3f}")


if __name__ == "__main__":
    main()
