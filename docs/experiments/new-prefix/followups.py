#!/usr/bin/env python3
"""followups.py RECORDS.jsonl...: for each policy in kvroute simulate --records output of an
inference-perf shared-prefix run, the TTFT mean of all requests and of the follow-ups (the
requests that found part of their prompt cached), and how many first requests (nothing
cached) and follow-ups were queued ahead of a follow-up on its instance when it arrived
(routed before it, first token after its arrival). docs/results.md, "The scorecard"."""
import collections, json, statistics, sys

for fn in sys.argv[1:]:
    recs = [json.loads(line) for line in open(fn)]
    print(fn)
    for pol in sorted(set(r["policy"] for r in recs)):
        rs = [r for r in recs if r["policy"] == pol]
        by_ep = collections.defaultdict(list)
        for r in rs:
            by_ep[r["endpoint"]].append(r)
        fol = [r for r in rs if r["cached_tokens"] > 0]

        def ahead(r, first):
            return sum(1 for o in by_ep[r["endpoint"]]
                       if (o["cached_tokens"] == 0) == first
                       and o["arrival_ms"] < r["arrival_ms"] < o["first_token_ms"])

        print("  %-34s TTFT mean %.0f ms, follow-ups %.0f ms; ahead of a follow-up: %.3f first requests, %.3f follow-ups" % (
            pol, statistics.mean(r["ttft_ms"] for r in rs), statistics.mean(r["ttft_ms"] for r in fol),
            statistics.mean(ahead(r, True) for r in fol), statistics.mean(ahead(r, False) for r in fol)))
