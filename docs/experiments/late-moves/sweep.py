#!/usr/bin/env python3
"""sweep.py DIR...: sweep.sh's runs, load by load: prefix-aware's TTFT p99 and mean under the two
builds, and how many requests the round-14 rule decided (a home over the bound, nothing waiting
there, busier than the mean: tail.patch's dbg lines). Then, over the loads where the builds
differ, how often each figure rose and fell (with the two-sided sign test's p: the chance of a split
at least as uneven if rising and falling were equally likely), the range and the geometric mean of
the ratios."""
import glob, json, math, os, sys
rows = []
for d in sys.argv[1:]:
    for f in glob.glob(os.path.join(d, "old.*.json")):
        L = os.path.basename(f)[4:-5]
        o = json.load(open(f))["results"][0]["ttft_ms"]
        n = json.load(open(os.path.join(d, "new.%s.json" % L)))["results"][0]["ttft_ms"]
        e = os.path.join(d, "dbg.%s.err" % L)
        k = len({l.split()[1] for l in open(e)}) if os.path.exists(e) else -1
        rows.append((float(L), o, n, k))
rows.sort(key=lambda r: r[0])
for L, o, n, k in rows:
    print("load %.3f  p99 %8.1f -> %8.1f (%.3f)  mean %7.2f -> %7.2f (%.3f)  rule decided %d" % (
        L, o["p99"], n["p99"], n["p99"] / o["p99"], o["mean"], n["mean"], n["mean"] / o["mean"], k))
diff = [(o, n) for _, o, n, _ in rows if o != n]
print("%d loads, %d the same to the digit (the rule decided nothing)" % (len(rows), len(rows) - len(diff)))
for q in ("p99", "mean"):
    r = [n[q] / o[q] for o, n in diff]
    if r:
        up, down = sum(x > 1 for x in r), sum(x < 1 for x in r)
        m = up + down
        p = min(1.0, 2 * sum(math.comb(m, j) for j in range(max(up, down), m + 1)) / 2 ** m)
        print("%-4s new/old over %d loads: %d higher, %d lower (sign test p %.2f), %.3f to %.3f, geometric mean %.4f" % (
            q, len(r), up, down, p, min(r), max(r), math.exp(sum(map(math.log, r)) / len(r))))
