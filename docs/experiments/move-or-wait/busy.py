#!/usr/bin/env python3
"""busy.py SIM.json RECORDS.jsonl: for an agentic scale-up cell run by cell.sh, each policy's
busy fraction per instance over its own time in the fleet (instances 4-7 from the add at half the
arrivals' span, as the scorecard counts them), the imbalance that gives, its requests per
instance, and the requests after the add that found no more than the 3,000-token tool prompt
cached for a prompt over 6,000 tokens (sessions moved, or new ones with a long context), slowest
first."""
import json, sys
d = json.load(open(sys.argv[1]))
recs = [json.loads(l) for l in open(sys.argv[2])]
for r in d['results']:
    rr = [x for x in recs if x['policy'] == r['policy']]
    t0 = min(x['arrival_ms'] for x in rr)
    add = t0 + (max(x['arrival_ms'] for x in rr) - t0) / 2
    end = max(x['finish_ms'] for x in rr)
    own = [b * (end - t0) / (end - (add if i >= 4 else t0)) for i, b in enumerate(r['instance_busy_fraction'])]
    moved = sorted((x['ttft_ms'] for x in rr if x['prompt_tokens'] > 6000 and x['cached_tokens'] <= 3100 and x['arrival_ms'] > add), reverse=True)
    print(r['policy'], 'imbalance %.3f p99 %.1f ms' % (max(own) / (sum(own) / len(own)), r['ttft_ms']['p99']),
          'busy', [round(x, 3) for x in own], 'requests', r['instance_requests'],
          'long uncached after the add: %d' % len(moved), [round(x) for x in moved[:8]])
