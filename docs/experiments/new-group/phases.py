#!/usr/bin/env python3
"""phases.py SIM.json RECORDS.jsonl [BIN_S]: for a `kvroute simulate --json --records` run of an
inference-perf shared-prefix workload, per policy: each instance's busy fraction and groups (first
requests: nothing cached), the TTFT mean of first requests and follow-ups, the TTFT summed over
arrival bins of BIN_S seconds (default 5) with the first requests among them, and the ten slowest
requests (instance, arrival, TTFT, cached tokens). docs/results.md, "The scorecard", round 9."""
import collections, json, statistics, sys

sim = json.load(open(sys.argv[1]))
recs = [json.loads(line) for line in open(sys.argv[2])]
width = float(sys.argv[3]) * 1000 if len(sys.argv) > 3 else 5000.0
for res in sim["results"]:
    pol = res["policy"]
    rs = [r for r in recs if r["policy"] == pol]
    first = [r for r in rs if r["cached_tokens"] == 0]
    fol = [r for r in rs if r["cached_tokens"] > 0]
    groups = collections.Counter(r["endpoint"] for r in first)
    ts = sorted(r["ttft_ms"] for r in rs)
    print("%s: TTFT mean %.1f ms, p99 %.1f ms; first requests %.1f ms, follow-ups %.1f ms" % (
        pol, statistics.mean(ts), res["ttft_ms"]["p99"], statistics.mean(r["ttft_ms"] for r in first),
        statistics.mean(r["ttft_ms"] for r in fol)))
    print("  busy", [round(b, 3) for b in res["instance_busy_fraction"]],
          "groups", [groups["sim-%d" % i] for i in range(len(res["instance_busy_fraction"]))])
    bins = collections.defaultdict(lambda: [0, 0, 0.0])
    for r in rs:
        b = bins[int(r["arrival_ms"] // width)]
        b[0] += 1
        b[1] += r["cached_tokens"] == 0
        b[2] += r["ttft_ms"]
    print("  bin: requests/first/TTFT sum s:", " ".join(
        "%d:%d/%d/%.1f" % (k, v[0], v[1], v[2] / 1000) for k, v in sorted(bins.items())))
    print("  slowest:", "; ".join("%s %.1fs %.0fms %d" % (r["endpoint"], r["arrival_ms"] / 1000, r["ttft_ms"], r["cached_tokens"])
                                 for r in sorted(rs, key=lambda r: -r["ttft_ms"])[:10]))
