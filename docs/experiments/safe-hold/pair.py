#!/usr/bin/env python3
"""pair.py RECORDS.jsonl A B: pair the requests of policies A and B by id; per request the queue
its endpoint held at its arrival (requests routed there, not yet at first token: count and
uncached tokens; requests decoding), and where the TTFT difference comes from."""
import collections, json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
A, B = sys.argv[2], sys.argv[3]
by = {p: {r["id"]: r for r in recs if r["policy"] == p} for p in (A, B)}
def ctx(rs):
    per = collections.defaultdict(list)
    for r in rs.values(): per[r["endpoint"]].append(r)
    out = {}
    for ep, l in per.items():
        for r in l:
            t = r["arrival_ms"]
            q = [o for o in l if o is not r and o["arrival_ms"] <= t and o["first_token_ms"] > t]
            d = [o for o in l if o["first_token_ms"] <= t and o["finish_ms"] > t]
            out[r["id"]] = (len(q), sum(o["prompt_tokens"] - o["cached_tokens"] for o in q), len(d),
                            sum(1 for o in q if o["cached_tokens"] == 0))
    return out
ca, cb = ctx(by[A]), ctx(by[B])
ids = sorted(by[A], key=lambda i: by[A][i]["arrival_ms"])
for p, c in ((A, ca), (B, cb)):
    rs = by[p]
    first = [i for i in ids if rs[i]["cached_tokens"] == 0]
    fol = [i for i in ids if rs[i]["cached_tokens"] > 0]
    print("%s: mean %.1f first %.1f (n %d) follow %.1f (n %d); at follow-up arrival: queued n %.3f tokens %.0f firsts %.3f decoding %.2f" % (
        p, statistics.mean(rs[i]["ttft_ms"] for i in ids), statistics.mean(rs[i]["ttft_ms"] for i in first), len(first),
        statistics.mean(rs[i]["ttft_ms"] for i in fol), len(fol),
        statistics.mean(c[i][0] for i in fol), statistics.mean(c[i][1] for i in fol), statistics.mean(c[i][3] for i in fol),
        statistics.mean(c[i][2] for i in fol)))
    eps = collections.Counter(rs[i]["endpoint"] for i in ids)
    print("   requests per endpoint", sorted(eps.values()))
# differences
d = [(by[A][i]["ttft_ms"] - by[B][i]["ttft_ms"], i) for i in ids]
print("sum diff A-B %.0f ms over %d; mean %.2f" % (sum(x for x, _ in d), len(d), statistics.mean(x for x, _ in d)))
# by arrival bins of 10% of the run
T = max(by[A][i]["arrival_ms"] for i in ids)
bins = collections.defaultdict(float)
for x, i in d: bins[int(10 * by[A][i]["arrival_ms"] / (T + 1))] += x
print("diff by tenth of the run (s):", " ".join("%.1f" % (bins[k] / 1000) for k in range(10)))
# by category
cat = collections.defaultdict(float)
for x, i in d:
    a, b = by[A][i], by[B][i]
    k = ("first" if a["cached_tokens"] == 0 else "fol") + ("/movedA" if a["cached_tokens"] == 0 and b["cached_tokens"] > 0 else "")
    cat[k] += x
print("diff by category (s):", {k: round(v / 1000, 1) for k, v in cat.items()})
# largest contributions
d.sort()
for x, i in d[-12:][::-1]:
    a, b = by[A][i], by[B][i]
    print("  %s arr %.1fs  A %s ttft %.0f cached %d q(n %d tok %d firsts %d dec %d) | B %s ttft %.0f cached %d q(n %d tok %d firsts %d dec %d)" % (
        i, a["arrival_ms"] / 1000, a["endpoint"], a["ttft_ms"], a["cached_tokens"], *ca[i][:2], ca[i][3], ca[i][2],
        b["endpoint"], b["ttft_ms"], b["cached_tokens"], *cb[i][:2], cb[i][3], cb[i][2]))
