#!/usr/bin/env python3
"""loads.py GROUPS.txt R05.jsonl R07.jsonl R09.jsonl POLICY...: one seed's three loads are one
request sequence (the speed-up scales the arrival times; `simulate --speedup`): per policy, how
many groups sit with the same other groups at every load (the placement, up to the endpoints'
names: pairs of groups on one endpoint at each load over those at 0.5), and how many of the
colliding follow-ups (collide.py's) collide at each pair of loads."""
import collections, itertools, json, sys
grp = dict(tuple(map(int, l.split())) for l in open(sys.argv[1]))
files = sys.argv[2:5]
def load(f, pol):
    return sorted((r for r in map(json.loads, open(f)) if r["policy"] == pol), key=lambda r: r["arrival_ms"])
def pairs(rs):
    home = {}
    for r in rs: home.setdefault(grp[int(r["id"])], r["endpoint"])
    by = collections.defaultdict(list)
    for g, e in home.items(): by[e].append(g)
    return {p for gs in by.values() for p in itertools.combinations(sorted(gs), 2)}
def collisions(rs):
    home = {}; out = set()
    for i, r in enumerate(rs):
        g = grp[int(r["id"])]
        if g in home: continue
        for o in rs[i + 1:]:
            if o["arrival_ms"] >= r["first_token_ms"]: break
            og = grp[int(o["id"])]
            if og in home and og != g and o["endpoint"] == r["endpoint"]: out.add(o["id"])
        home[g] = r["endpoint"]
    return out
for pol in sys.argv[5:]:
    rs = [load(f, pol) for f in files]
    p = [pairs(x) for x in rs]; c = [collisions(x) for x in rs]
    print("%s: group pairs sharing an endpoint kept from 0.5 at 0.7, 0.9: %d, %d of %d; collisions %d, %d, %d; common to 0.5 and 0.7 %d, 0.7 and 0.9 %d, all three %d" % (
        pol, len(p[0] & p[1]), len(p[0] & p[2]), len(p[0]), len(c[0]), len(c[1]), len(c[2]), len(c[0] & c[1]), len(c[1] & c[2]), len(c[0] & c[1] & c[2])))
