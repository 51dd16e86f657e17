#!/usr/bin/env python3
"""slow.py RECORDS.jsonl [N]: the N slowest requests of one cell's --records (cell.sh), by TTFT:
arrival, endpoint, prompt and cached tokens; then the requests after 50 s that found no more than
the agentic scale-up's common prefix (2,992 tokens) cached with over 3,000 tokens to compute
(the bound's moves, and new sessions), and their TTFTs summed (docs/results.md, round 14)."""
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 20
r.sort(key=lambda x: -x["ttft_ms"])
for x in r[:n]:
    print("%7.1f s  %-6s %-6s ttft %7.1f  prompt %6d cached %6d  unc %6d" % (
        x["arrival_ms"] / 1e3, x["id"], x["endpoint"], x["ttft_ms"], x["prompt_tokens"],
        x["cached_tokens"], x["prompt_tokens"] - x["cached_tokens"]))
mv = [x for x in r if x["arrival_ms"] > 50e3 and x["cached_tokens"] <= 3000 and x["prompt_tokens"] - x["cached_tokens"] > 3000]
print("after 50 s, no more than the common prefix cached, over 3,000 tokens to compute: %d, TTFTs summed %.2f s" % (
    len(mv), sum(x["ttft_ms"] for x in mv) / 1e3))
