#!/usr/bin/env python3
"""agg.py SWEEP.txt: sweep.sh's lines per cell, summed up per seed set and shape: cells, the
TTFT mean ratio (prefix-aware over cache-aware), collisions realized and expected of each
policy, (realized - expected) / sd, and how much of the difference of the TTFT sums the
collisions' TTFT accounts for; then the cells where the ratio is over 1.02, and the ratio each cell
would have with each policy's collisions at their expected number (its collisions' TTFT sum
scaled by expected over realized)."""
import re, statistics, sys, collections
cells = []; cur = None
for l in open(sys.argv[1]):
    m = re.match(r"== (\S+) (\S+) s(\d+)", l)
    if m: cur = {"shape": m[1], "load": float(m[2]), "seed": int(m[3])}; cells.append(cur); continue
    m = re.match(r"(\S+): TTFT mean ([\d.]+);.*follow-ups [\d.]+ \(n (\d+)\); collisions (\d+), expected ([\d.]+) \+- ([\d.]+); their TTFT sum ([\d.]+) s", l)
    if m and cur is not None:
        n = 750 if cur["shape"] == "150x5" else 249
        cur[m[1]] = dict(mean=float(m[2]), col=int(m[4]), exp=float(m[5]), sd=float(m[6]), colsum=float(m[7]), n=n)
cells = [c for c in cells if "prefix-aware" in c and "cache-aware" in c]
def z(p): return (p["col"] - p["exp"]) / max(p["sd"], 1e-9)
def atexp(p): return (p["mean"] * p["n"] / 1000 - p["colsum"] + p["colsum"] * p["exp"] / max(p["col"], 1)) * 1000 / p["n"]
def radj(c): return atexp(c["prefix-aware"]) / atexp(c["cache-aware"])
sets = [("1-5", range(1, 6)), ("6-10", range(6, 11)), ("11-15", range(11, 16)), ("16-20", range(16, 21)), ("1-20", range(1, 21))]
print("| seeds | shape | cells | ratio > 1.02 | at the expected collisions | TTFT mean ratio | at the expected | collisions PA / CA (sum), expected PA / CA | z PA / CA (mean) | TTFT sum diff, s: all / collisions |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for name, rg in sets:
    for sh in ("150x5", "83x3"):
        cs = [c for c in cells if c["seed"] in rg and c["shape"] == sh]
        if not cs: continue
        a = [c["prefix-aware"] for c in cs]; b = [c["cache-aware"] for c in cs]
        r = [x["mean"] / y["mean"] for x, y in zip(a, b)]
        d_all = sum((x["mean"] - y["mean"]) * x["n"] for x, y in zip(a, b)) / 1000
        d_col = sum(x["colsum"] - y["colsum"] for x, y in zip(a, b))
        print("| %s | %s | %d | %d | %d | %.3f | %.3f | %d / %d, %.0f / %.0f | %+.2f / %+.2f | %.1f / %.1f |" % (
            name, sh, len(cs), sum(x > 1.02 for x in r), sum(radj(c) > 1.02 for c in cs), statistics.mean(r), statistics.mean(map(radj, cs)), sum(x["col"] for x in a), sum(y["col"] for y in b),
            sum(x["exp"] for x in a), sum(y["exp"] for y in b), statistics.mean(map(z, a)), statistics.mean(map(z, b)), d_all, d_col))
print()
print("cells with the TTFT mean ratio over 1.02:")
for c in cells:
    a, b = c["prefix-aware"], c["cache-aware"]
    if a["mean"] / b["mean"] > 1.02:
        print("  %s %.1f s%d: ratio %.3f (at the expected collisions %.3f); collisions %d / %d (expected %.1f / %.1f, z %+.1f / %+.1f); TTFT sums differ %.1f s, the collisions' %.1f s" % (
            c["shape"], c["load"], c["seed"], a["mean"] / b["mean"], radj(c), a["col"], b["col"], a["exp"], b["exp"], z(a), z(b),
            (a["mean"] - b["mean"]) * a["n"] / 1000, a["colsum"] - b["colsum"]))
# across cells: does the collision difference go with the ratio?
xs = [c["prefix-aware"]["col"] - c["cache-aware"]["col"] for c in cells]
ys = [c["prefix-aware"]["mean"] / c["cache-aware"]["mean"] for c in cells]
if len(cells) > 2:
    print("correlation over %d cells of (collisions PA - CA) with the TTFT mean ratio: %.2f" % (len(cells), statistics.correlation(xs, ys)))
print("cells over 1.02 at the expected collisions:", ", ".join("%s %.1f s%d %.3f" % (c["shape"], c["load"], c["seed"], radj(c)) for c in cells if radj(c) > 1.02) or "none")
