#!/usr/bin/env python3
"""tocome.py RECORDS.jsonl GROUPS.txt POLICY...: for each first request, the follow-ups still to come
of the groups each endpoint holds (the workload's law: each of them is equally likely to be the
next follow-up), at the endpoint chosen against the mean over those with the fewest groups."""
import collections, json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
grp = dict(tuple(map(int, l.split())) for l in open(sys.argv[2]))
for pol in sys.argv[3:]:
    rs = sorted((r for r in recs if r["policy"] == pol), key=lambda r: r["arrival_ms"])
    eps = sorted({r["endpoint"] for r in rs})
    home = {}; left = collections.Counter()
    a = [0.0, 0.0, 0, 0.0]; n = 0
    for r in rs:
        g = grp[int(r["id"])]
        if g not in home:
            rem = {e: sum(left[h] for h, x in home.items() if x == e) for e in eps}
            cnt = collections.Counter(home.values())
            mn = min(cnt[e] for e in eps)
            tied = [e for e in eps if cnt[e] == mn]
            if len(tied) > 1 and r["endpoint"] in tied:
                n += 1; a[0] += rem[r["endpoint"]]; a[1] += statistics.mean(rem[e] for e in tied)
                a[2] += rem[r["endpoint"]] < statistics.mean(rem[e] for e in tied)
            a[3] += rem[r["endpoint"]] / max(statistics.mean(rem.values()), 1e-9)
            home[g] = r["endpoint"]; left[g] = 4
        else:
            left[g] -= 1
    print("%s: %d placements among ties: follow-ups to come at the chosen %.2f vs ties %.2f (below the ties' mean %d times); chosen over the fleet's mean, mean over all placements %.3f" % (pol, n, a[0] / n, a[1] / n, a[2], a[3] / 150))
