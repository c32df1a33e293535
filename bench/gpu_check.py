"""bench/gpu_check.py: the comparisons and sums of bench/gpu.sh, one
subcommand each. Each prints one JSON object (the step's numbers) on
stdout and exits 0 when the check holds, 1 when it does not, 2 on bad
input. Standard library only (python3 of any device image).

  prompts N LEN MAX_TOKENS VOCAB SEED   JSONL prompts of random ids (BOS 1 first)
  greedy REF OUT            ids equal the reference up to its first margin < 1e-3
  logits CPU GPU TOL        argmax and top-10 log-probs, position by position
  invariance ALONE OUT...   every prompt's ids alone equal its ids in each batch run
  decode CKPT BENCH BW      step times and the weight + KV roofline of llm-bench model
  tap LOG                   a TAP log's counts and its first failing lines, each
                            with the diagnostics before it (test_cuda's report)
"""
import json
import os
import random
import struct
import sys


def jsonl(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def done(numbers, ok):
    print(json.dumps(numbers))
    sys.exit(0 if ok else 1)


def prompts(n, length, max_tokens, vocab, seed):
    rng = random.Random(int(seed))
    for _ in range(int(n)):
        ids = [1] + [rng.randrange(3, int(vocab)) for _ in range(int(length) - 1)]
        print(json.dumps({"prompt_ids": ids, "max_tokens": int(max_tokens), "temperature": 0}))


def greedy(ref, out):
    refs, outs = jsonl(ref), jsonl(out)
    bad, compared = 0, 0
    for r, o in zip(refs, outs):
        # the reference's rule: ids are defined up to the first near tie
        n = next((i for i, m in enumerate(r["margins"]) if m < 1e-3), r["n"])
        compared += n
        if o["ids"][:n] != r["ids"][:n]:
            bad += 1
    ok = len(refs) == len(outs) and bad == 0
    done({"prompts": len(refs), "outputs": len(outs), "ids_compared": compared, "prompts_differing": bad}, ok)


def logits(cpu, gpu, tol):
    """Position by position while both sides generated the same ids: the
    argmax must agree wherever the CPU's top-1 margin exceeds 2 TOL (below
    it, rounding may legitimately swap the two), and every id in both top-10
    lists must have log-probs within TOL. Comparison of a prompt stops after
    the first position whose chosen ids differ (the contexts part there)."""
    tol = float(tol)
    a, b = jsonl(cpu), jsonl(gpu)
    pos = agree = required = req_agree = 0
    worst = 0.0
    min_common = 10
    for x, y in zip(a, b):
        for i, (tx, ty) in enumerate(zip(x["top_logprobs"], y["top_logprobs"])):
            pos += 1
            margin = tx[0]["logprob"] - tx[1]["logprob"] if len(tx) > 1 else float("inf")
            same = tx[0]["id"] == ty[0]["id"]
            agree += same
            if margin > 2 * tol:
                required += 1
                req_agree += same
            gy = {t["id"]: t["logprob"] for t in ty}
            common = [t for t in tx if t["id"] in gy]
            min_common = min(min_common, len(common))
            for t in common:
                worst = max(worst, abs(t["logprob"] - gy[t["id"]]))
            if x["ids"][i] != y["ids"][i]:
                break
    ok = len(a) == len(b) and pos > 0 and req_agree == required and worst <= tol and min_common >= 5
    done({"prompts": len(a), "positions": pos, "argmax_agree": agree, "argmax_required": required,
          "argmax_required_agree": req_agree, "max_top10_dlogprob": worst, "tol": tol,
          "min_common_top10": min_common}, ok)


def invariance(alone, *outs):
    base = [r["ids"] for r in jsonl(alone)]
    differ, runs = 0, []
    for path in outs:
        ids = [r["ids"] for r in jsonl(path)]
        d = sum(1 for p, q in zip(base, ids) if p != q) + abs(len(base) - len(ids))
        runs.append({"run": os.path.basename(path), "differing": d})
        differ += d
    done({"prompts": len(base), "runs": runs, "differing": differ}, len(base) > 0 and differ == 0)


def safetensors_bytes(ckpt, tied):
    """Bytes of every tensor a decode step reads whole: all but the
    embedding table (a step gathers one row of it), unless TIED (the table
    is the lm_head too, read whole)."""
    files = [ckpt] if ckpt.endswith(".safetensors") else \
        [os.path.join(ckpt, f) for f in sorted(os.listdir(ckpt)) if f.endswith(".safetensors")]
    total = emb = 0
    for path in files:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
        for name, t in hdr.items():
            if name == "__metadata__":
                continue
            size = t["data_offsets"][1] - t["data_offsets"][0]
            total += size
            if "embed_tokens" in name:
                emb += size
    return (total if tied else total - emb), emb


def decode(ckpt, bench, bw):
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    wbytes, emb = safetensors_bytes(ckpt, cfg.get("tie_word_embeddings", False))
    gbs = json.load(open(bw))["copy_gbs"]
    n_layer, n_kv = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
    d_head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rows = []
    for r in jsonl(bench):
        if not r["test"].startswith("tg"):
            continue
        n_gen = int(r["test"][2:].split()[0])
        b = r["batch"]
        step_s = b / r["tok_s"]
        # f32 KV (llm-bench's default), K and V, the mean context of a tg run from empty
        kv = b * (n_gen + 1) / 2 * n_layer * 2 * n_kv * d_head * 4
        roof_s = (wbytes + kv) / (gbs * 1e9)
        rows.append({"batch": b, "step_ms": step_s * 1e3, "tok_s": r["tok_s"], "wrong": r["wrong"],
                     "roofline_ms": roof_s * 1e3, "fraction_of_roofline": roof_s / step_s})
    one = next((r for r in rows if r["batch"] == 1), None)
    out = {"weight_bytes_per_step": wbytes, "embedding_bytes": emb, "bandwidth_gbs": gbs, "rows": rows,
           "batch1_fraction_of_roofline": one and one["fraction_of_roofline"], "target_batch1": 0.90}
    done(out, bool(rows) and all(r["wrong"] == 0 for r in rows))


def tap(log, keep=6, diag=4):
    """Counts of ok / not ok / SKIP lines, and the first KEEP failing lines
    (which carry their first failure: tests/lib/check.h), each with up to
    DIAG of the '#' lines just before it, for a step's JSON."""
    lines = open(log, errors="replace").read().splitlines()
    ok = sum(1 for l in lines if l.startswith("ok"))
    skip = sum(1 for l in lines if l.startswith("ok") and "# SKIP" in l)
    failures = []
    for i, l in enumerate(lines):
        if not l.startswith("not ok"):
            continue
        before = []
        j = i - 1
        while j >= 0 and lines[j].startswith("#") and len(before) < diag:
            before.insert(0, lines[j][:400])
            j -= 1
        if len(failures) < keep:
            failures.append({"line": l[:1200], "diagnostics": before})
    not_ok = sum(1 for l in lines if l.startswith("not ok"))
    done({"ok": ok, "not_ok": not_ok, "skip": skip, "failures": failures}, not_ok == 0)


if __name__ == "__main__":
    cmds = {"prompts": prompts, "greedy": greedy, "logits": logits, "invariance": invariance, "decode": decode,
            "tap": tap}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.stderr.write(__doc__)
        sys.exit(2)
    try:
        cmds[sys.argv[1]](*sys.argv[2:])
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        sys.stderr.write("gpu_check.py %s: %s\n" % (sys.argv[1], e))
        sys.exit(2)
