#!/usr/bin/env python3
"""tocome.py RECORDS.jsonl GROUPS.txt POLICY...: safe-hold/tocome.py for any group size: for each
first request, the follow-ups still to come of the groups each endpoint holds (under the
workload's law each is equally likely to be the next follow-up, so a new group's prefill
collides with the chosen endpoint's in proportion to them), at the endpoint chosen against the
fleet's mean and the mean over the endpoints with the fewest groups; and how often the chosen
one had the fewest follow-ups received among those tied (the smallest tree), and how many
fewer to come the tied endpoint with the fewest would have had (what an oracle could gain)."""
import collections, json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
grp = dict(tuple(map(int, l.split())) for l in open(sys.argv[2]))
size = collections.Counter(grp.values())
for pol in sys.argv[3:]:
    rs = sorted((r for r in recs if r["policy"] == pol), key=lambda r: r["arrival_ms"])
    eps = sorted({r["endpoint"] for r in rs})
    home = {}; left = collections.Counter(); got = collections.Counter()
    n = tie = low = least = 0; ch = ti = fl = lo = 0.0
    for r in rs:
        g = grp[int(r["id"])]
        if g in home:
            left[g] -= 1; got[r["endpoint"]] += 1; continue
        rem = {e: sum(left[h] for h, x in home.items() if x == e) for e in eps}
        cnt = collections.Counter(home.values())
        mn = min(cnt[e] for e in eps)
        tied = [e for e in eps if cnt[e] == mn]
        n += 1; ch += rem[r["endpoint"]]; fl += statistics.mean(rem.values())
        if len(tied) > 1 and r["endpoint"] in tied:
            tie += 1; ti += statistics.mean(rem[e] for e in tied)
            lo += rem[r["endpoint"]] - min(rem[e] for e in tied)
            low += rem[r["endpoint"]] < statistics.mean(rem[e] for e in tied)
            least += got[r["endpoint"]] == min(got[e] for e in tied)
        home[g] = r["endpoint"]; left[g] = size[g] - 1
    print("%s: %d placements, follow-ups to come at the chosen %.2f, fleet mean %.2f (ratio %.3f); %d among ties on the fewest groups (the chosen had the fewest received among them %d times, to come below the ties' mean %d times); the tied one with the fewest to come would have had %.2f fewer (%.1f %% of the chosen's)" % (
        pol, n, ch / n, fl / n, ch / fl, tie, least, low, lo / n, 100 * lo / ch))
