#!/usr/bin/env python3
"""tail.py OLD.jsonl NEW.jsonl DBG.err [N]: one Mooncake run (--records) under two builds, and the
requests the round-14 rule decided in it (tail.patch, KVR_EXP=dbg): each decided request's
placement and TTFT under both; the first request placed elsewhere and how many follow it; the
slowest 1 % under each (own long prefills, or short ones that waited); the requests around the
p99; and the N largest TTFT rises, each with the longest prefill ahead of it at its endpoint."""
import json, sys

def load(p):
    return {x["id"]: x for x in map(json.loads, open(p))}

a, b = load(sys.argv[1]), load(sys.argv[2])
N = int(sys.argv[4]) if len(sys.argv) > 4 else 6
ids = sorted(a, key=int)
unc = lambda x: x["prompt_tokens"] - x["cached_tokens"]
seen = []
for l in open(sys.argv[3]):
    i = l.split()[1]
    if i in seen:
        continue
    seen.append(i)
    print("rule decided %6s at %7.1f s: prompt %6d; old %s cached %6d ttft %6.0f ms | new %s cached %6d ttft %6.0f ms" % (
        i, a[i]["arrival_ms"] / 1e3, a[i]["prompt_tokens"], a[i]["endpoint"], a[i]["cached_tokens"], a[i]["ttft_ms"],
        b[i]["endpoint"], b[i]["cached_tokens"], b[i]["ttft_ms"]))
d = [i for i in ids if a[i]["endpoint"] != b[i]["endpoint"]]
t = [i for i in ids if a[i]["ttft_ms"] != b[i]["ttft_ms"]]
if d:
    print("first placed elsewhere: %s at %.1f s; %d of %d placed elsewhere, %d with another TTFT" % (
        d[0], a[d[0]]["arrival_ms"] / 1e3, len(d), len(ids), len(t)))
k = len(ids) // 100
for name, r in (("old", a), ("new", b)):
    s = sorted(r.values(), key=lambda x: -x["ttft_ms"])
    top = s[:k]
    cold = [x for x in top if unc(x) > 60000]
    warm = [x for x in top if unc(x) < 10000]
    print("%s: slowest 1 %% (%d): %d with over 60,000 tokens to compute (TTFT mean %.0f ms), %d with under 10,000 (%.0f ms)" % (
        name, k, len(cold), sum(x["ttft_ms"] for x in cold) / max(len(cold), 1), len(warm),
        sum(x["ttft_ms"] for x in warm) / max(len(warm), 1)))
    for j in range(k - 4, k + 4):
        x = s[j]
        print("   rank %4d %6s %s at %7.1f s prompt %6d to compute %6d ttft %6.0f" % (
            j + 1, x["id"], x["endpoint"], x["arrival_ms"] / 1e3, x["prompt_tokens"], unc(x), x["ttft_ms"]))

def ahead(r, x):
    # the longest prefill routed to x's endpoint before x and at its first token after x came
    c = [y for y in r.values() if y["endpoint"] == x["endpoint"] and y["id"] != x["id"]
         and y["arrival_ms"] <= x["arrival_ms"] < y["first_token_ms"]]
    return max(c, key=unc) if c else None

print("largest TTFT rises, and the longest prefill ahead of each at its endpoint:")
for i in sorted(ids, key=lambda i: a[i]["ttft_ms"] - b[i]["ttft_ms"])[:N]:
    out = []
    for r in (a, b):
        x, y = r[i], ahead(r, r[i])
        out.append("%s to compute %6d ttft %6.0f ahead %s" % (x["endpoint"], unc(x), x["ttft_ms"],
                   "%s (%d tokens)" % (y["id"], unc(y)) if y else "-"))
    print("  %6s at %7.1f s: old %s | new %s" % (i, a[i]["arrival_ms"] / 1e3, out[0], out[1]))
