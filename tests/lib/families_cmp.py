#!/usr/bin/env python3
"""tests/lib/families_cmp.py: llm-generate's next-token distributions on a
model of mkrandom.py against hfref.py's float64 forward of the same files
(both in ../shared/tools, which is not part of this project).

    families_cmp.py prompts HF_DIR N OUT.jsonl
        the sequence (BOS 1, then ids drawn by random.Random(1) in
        [3, vocab_size - 1], N in all) as N JSONL prompts {"prompt_ids":
        ids[0..P]}, P = 0 .. N-1, for llm-generate -n 1 --logprobs 10 --json
    families_cmp.py compare TOOLS HF_DIR N OURS.jsonl [--abl=X] [--sw=W]
        hfref.forward of the N ids (with --abl=X: one feature left out of the
        reference, hfref's ablations; with --sw=W: a sliding window of W on
        every layer, hfref's --sw) against OURS, llm-generate's answers
        to those prompts: at every position the greedy id is the reference's
        argmax, each of our top 10 log-probs is within 2e-3 of the
        reference's log-softmax of that id, and no id of the reference's top
        10 is missing from ours unless within 2e-3 of our 10th (a tie at the
        edge). One line; exit 0 when all hold, 3 when one does not.
"""
import json, random, sys

TOL = 2e-3

def ids_of(d, n):
    v = json.load(open(d + "/config.json"))["vocab_size"]
    r = random.Random(1)
    return [1] + [r.randint(3, v - 1) for _ in range(n - 1)]

def main():
    if sys.argv[1] == "prompts":
        d, n, out = sys.argv[2], int(sys.argv[3]), sys.argv[4]
        ids = ids_of(d, n)
        with open(out, "w") as f:
            for p in range(n):
                f.write(json.dumps({"prompt_ids": ids[:p + 1]}) + "\n")
        return 0
    tools, d, n, ours = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    sys.path.insert(0, tools)
    import hfref
    import numpy as np
    sw = None
    for a in sys.argv[6:]:
        if a.startswith("--abl="):
            hfref.ABL.add(a[6:])
        if a.startswith("--sw="):
            sw = int(a[5:])
    ids = ids_of(d, n)
    ref = hfref.forward(d, ids, sw)
    lp = ref - ref.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    rows = sorted((json.loads(l) for l in open(ours)), key=lambda o: len(o["prompt_ids"]))
    worst, bad = 0.0, []
    for p, row in enumerate(rows):
        top = row["top_logprobs"][0]
        if row["ids"][0] != int(lp[p].argmax()):
            bad.append("position %d: greedy id %d, reference %d" % (p, row["ids"][0], int(lp[p].argmax())))
        for e in top:
            worst = max(worst, abs(e["logprob"] - lp[p][e["id"]]))
        ours_top = {e["id"] for e in top}
        for i in np.argsort(-lp[p])[:10].tolist():
            if i not in ours_top and lp[p][i] > top[-1]["logprob"] + TOL:
                bad.append("position %d: id %d of the reference's top 10 missing" % (p, i))
    if len(rows) != n:
        bad.append("%d answers for %d prompts" % (len(rows), n))
    if worst > TOL:
        bad.append("a log-prob differs by %.3e" % worst)
    print("%d positions, max |log-prob diff| %.3e%s" % (len(rows), worst, "; " + "; ".join(bad[:3]) if bad else ""))
    return 3 if bad else 0

sys.exit(main())
