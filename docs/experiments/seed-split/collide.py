#!/usr/bin/env python3
"""collide.py RECORDS.jsonl GROUPS.txt POLICY...: safe-hold/collide.py for any group size (read
from GROUPS.txt): follow-ups arriving at their home while a first request is prefilled there
(from its arrival to its first token), realized against expected by the workload's law (each
follow-up arriving in the window, fleet-wide, is one of the endpoint's with probability its
follow-ups to come over the fleet's; the group just placed excluded on both sides). Also the
TTFT of those follow-ups against all the others', and the first requests' mean."""
import collections, json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
grp = dict(tuple(map(int, l.split())) for l in open(sys.argv[2]))
size = collections.Counter(grp.values())
for pol in sys.argv[3:]:
    rs = sorted((r for r in recs if r["policy"] == pol), key=lambda r: r["arrival_ms"])
    home = {}; left = collections.Counter(); real = exp = 0.0; hit = set(); var = 0.0
    for i, r in enumerate(rs):
        g = grp[int(r["id"])]
        if g in home:
            left[g] -= 1; continue
        e, t1 = r["endpoint"], r["first_token_ms"]
        tot = sum(left.values())
        mine = sum(left[h] for h, x in home.items() if x == e)
        for o in rs[i + 1:]:
            if o["arrival_ms"] >= t1: break
            og = grp[int(o["id"])]
            if og in home and og != g:
                p = mine / max(tot, 1); exp += p; var += p * (1 - p)
                if o["endpoint"] == e: real += 1; hit.add(o["id"])
        home[g] = e; left[g] = size[g] - 1
    fol = [r for r in rs if r["cached_tokens"] > 0]
    first = [r for r in rs if r["cached_tokens"] == 0]
    col = [r["ttft_ms"] for r in fol if r["id"] in hit]
    oth = [r["ttft_ms"] for r in fol if r["id"] not in hit]
    print("%s: TTFT mean %.1f; firsts %.1f (n %d); follow-ups %.1f (n %d); collisions %d, expected %.1f +- %.1f; their TTFT sum %.1f s (mean %.0f ms), the other follow-ups' mean %.1f ms" % (
        pol, statistics.mean(r["ttft_ms"] for r in rs), statistics.mean(r["ttft_ms"] for r in first), len(first),
        statistics.mean(r["ttft_ms"] for r in fol), len(fol), real, exp, var ** 0.5, sum(col) / 1000,
        statistics.mean(col) if col else 0, statistics.mean(oth)))
