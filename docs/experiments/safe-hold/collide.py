#!/usr/bin/env python3
"""collide.py RECORDS.jsonl GROUPS.txt POLICY...: collisions (follow-ups arriving at their home while
a first request is prefilled there, from its arrival to its first token), realized against
expected by the workload's law: each follow-up arriving in the window, fleet-wide, is one of the
endpoint's with probability (its follow-ups to come) / (the fleet's); the group just placed
excluded on both sides (its own follow-ups land with it under any placement)."""
import collections, json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
grp = dict(tuple(map(int, l.split())) for l in open(sys.argv[2]))
for pol in sys.argv[3:]:
    rs = sorted((r for r in recs if r["policy"] == pol), key=lambda r: r["arrival_ms"])
    home = {}; left = collections.Counter(); real = exp = 0.0; cost = 0.0
    for i, r in enumerate(rs):
        g = grp[int(r["id"])]
        if g in home:
            left[g] -= 1; continue
        e, t0, t1 = r["endpoint"], r["arrival_ms"], r["first_token_ms"]
        tot = sum(left.values())
        mine = sum(left[h] for h, x in home.items() if x == e)
        for o in rs[i + 1:]:
            if o["arrival_ms"] >= t1: break
            og = grp[int(o["id"])]
            if og in home and og != g:
                exp += mine / max(tot, 1)
                if o["endpoint"] == e: real += 1; cost += o["ttft_ms"]
        home[g] = e; left[g] = 4
    print("%s: collisions %d, expected %.1f (their TTFT sum %.1f s)" % (pol, real, exp, cost / 1000))
