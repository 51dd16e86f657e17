#!/usr/bin/env python3
"""judge.py BASE.json [CAND.json]: prefix-aware's verdict per cell, as internal/scorecard/score.go
gives it (hit rate 0.98 of the pooled bound or within 0.005 of the best; TTFT mean and p99 at most
1.02 x the best other policy's, least-request's on the no-sharing cells; imbalance at most 1.2).
BASE is a `kvroute simulate --scorecard --json` run of every policy; CAND, a run of one policy whose
name starts with prefix-aware (--policies prefix-aware[:k=v]) on the same cells, whose scores
replace BASE's prefix-aware in each cell it has (the other policies' figures are BASE's: they do
not depend on prefix-aware). Prints one line per cell, then cells met per scenario."""
import json, sys
base = json.load(open(sys.argv[1]))
cand = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else None
def key(c): return (c["scenario"], c["load"], c["seed"])
cs = {}
if cand:
    for c in cand["cells"]:
        for s in c.get("scores", []):
            if s["policy"].startswith("prefix-aware"): cs[key(c)] = s
tot = met = 0
by = {}
for c in base["cells"]:
    if c.get("skipped"): continue
    k = key(c)
    if cand and k not in cs: continue
    scores = c["scores"]
    subj = cs[k] if cand else next(s for s in scores if s["policy"] == "prefix-aware")
    others = [s for s in scores if s["policy"] != "prefix-aware" and s["completed"] > 0]
    b = c["bounds"]["pooled_lru_hit_rate"] if "pooled_lru_hit_rate" in c["bounds"] else None
    miss = []
    if subj["failed"] > 0: miss.append("failed")
    if c.get("no_sharing"):
        lr = next(s for s in others if s["policy"] == "least-request")
        rm, rp = subj["ttft_ms"]["mean"]/lr["ttft_ms"]["mean"], subj["ttft_ms"]["p99"]/lr["ttft_ms"]["p99"]
    else:
        allp = others + [subj]
        hob = lambda s: s["hit_rate"]/b if b else 0
        reached = any(hob(s) >= 0.98 for s in allp)
        best = max(s["hit_rate"] for s in allp)
        if reached and hob(subj) < 0.98: miss.append("hit %.3f" % hob(subj))
        if not reached and subj["hit_rate"] < best - 0.005: miss.append("hit -%.4f" % (best-subj["hit_rate"]))
        rm = subj["ttft_ms"]["mean"]/min(s["ttft_ms"]["mean"] for s in others)
        rp = subj["ttft_ms"]["p99"]/min(s["ttft_ms"]["p99"] for s in others)
    if rm > 1.02: miss.append("mean %.3f" % rm)
    if rp > 1.02: miss.append("p99 %.3f" % rp)
    if subj["imbalance"] > 1.2: miss.append("imb %.3f" % subj["imbalance"])
    ok = not miss
    tot += 1; met += ok
    d = by.setdefault(c["scenario"], [0, 0]); d[0] += ok; d[1] += 1
    print("%-22s %.1f s%d  mean %.3f p99 %.3f imb %.3f hit %.4f  %s" % (c["scenario"], c["load"], c["seed"], rm, rp, subj["imbalance"], subj["hit_rate"], "ok" if ok else "MISS " + ", ".join(miss)))
for s, (m, n) in by.items(): print("%-22s %d of %d" % (s, m, n))
print("total %d of %d" % (met, tot))
