#!/usr/bin/env python3
"""window.py RECORDS.jsonl GROUPS.txt POLICY...: the follow-ups that collide (collide.py) split
by what they waited for: the rest of the first request's prefill at their arrival (its first
token minus their arrival) and what came after it (their TTFT minus that); then the first
requests' own windows (arrival to first token) and how much follow-up traffic of the endpoint's
groups each window could catch."""
import collections, json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
grp = dict(tuple(map(int, l.split())) for l in open(sys.argv[2]))
for pol in sys.argv[3:]:
    rs = sorted((r for r in recs if r["policy"] == pol), key=lambda r: r["arrival_ms"])
    home = {}; rest = []; after = []; win = []
    for i, r in enumerate(rs):
        g = grp[int(r["id"])]
        if g in home: continue
        e, t1 = r["endpoint"], r["first_token_ms"]
        win.append(t1 - r["arrival_ms"])
        for o in rs[i + 1:]:
            if o["arrival_ms"] >= t1: break
            og = grp[int(o["id"])]
            if og in home and og != g and o["endpoint"] == e:
                rest.append(t1 - o["arrival_ms"]); after.append(o["ttft_ms"] - (t1 - o["arrival_ms"]))
        home[g] = e
    print("%s: %d collisions; rest of the first's prefill at arrival mean %.0f ms (sum %.1f s); after it mean %.0f ms (sum %.1f s); first requests' windows mean %.0f ms" % (
        pol, len(rest), statistics.mean(rest), sum(rest) / 1000, statistics.mean(after), sum(after) / 1000, statistics.mean(win)))
