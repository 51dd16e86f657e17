#!/usr/bin/env python3
"""share2.py RECORDS.jsonl FT: share.py's inputs; one line per request whose first token came with
a step shared with requests behind it: its instance, arrival, TTFT and cached tokens, the step,
the tokens behind, and the requests that arrived on that instance after it and before the step."""
import sys, collections
from steps import load as steps_load
recs, ft, steps = steps_load(sys.argv[1], sys.argv[2])
# who arrived at the same endpoint after the ahead one and before its step started
byep = collections.defaultdict(list)
for r in recs.values(): byep[r["endpoint"]].append(r)
for i, (c, p, dt, end) in sorted(ft.items(), key=lambda x: x[1][3]):
    behind = p - steps[(recs[i]["endpoint"], end)]
    if behind <= 0: continue
    r = recs[i]
    start = end - dt
    later = [x for x in byep[r["endpoint"]] if x["arrival_ms"] > r["arrival_ms"] and x["arrival_ms"] < start]
    print("ep %s ahead id %s arr %.0f ttft %.0f cached %d | step %.0f-%.0f behind %d | arrivals before step: %s" % (
        r["endpoint"], i, r["arrival_ms"], r["ttft_ms"], r["cached_tokens"], start, end, behind,
        [(x["id"], round(x["arrival_ms"]), x["cached_tokens"]) for x in later]))
