#!/usr/bin/env python3
"""waits.py DIR LOAD...: for each LOAD, DIR/old.LOAD.jsonl against DIR/new.LOAD.jsonl (--records):
the slowest 1 %'s short requests (under 10,000 tokens to compute: they waited behind others'
prefills) and the requests with under 10,000 tokens to compute and a TTFT over 2 s, with their
TTFTs summed; then the totals over the loads."""
import json, sys
tot = {"old": [0, 0, 0.0], "new": [0, 0, 0.0]}
for L in sys.argv[2:]:
    out = []
    for b in ("old", "new"):
        r = [json.loads(l) for l in open("%s/%s.%s.jsonl" % (sys.argv[1], b, L))]
        unc = lambda x: x["prompt_tokens"] - x["cached_tokens"]
        top = sorted(r, key=lambda x: -x["ttft_ms"])[:len(r) // 100]
        w = sum(unc(x) < 10000 for x in top)
        s = [x for x in r if unc(x) < 10000 and x["ttft_ms"] > 2000]
        t = sum(x["ttft_ms"] for x in s) / 1e3
        tot[b][0] += w; tot[b][1] += len(s); tot[b][2] += t
        out.append("%3d in the slowest 1 %%, %4d over 2 s (%6.1f s)" % (w, len(s), t))
    print("load %s  old %s | new %s" % (L, out[0], out[1]))
for b in ("old", "new"):
    print("%s: %d in the slowest 1 %%, %d over 2 s (%.1f s)" % (b, tot[b][0], tot[b][1], tot[b][2]))
