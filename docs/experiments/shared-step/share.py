#!/usr/bin/env python3
"""share.py RECORDS.jsonl FT: how often a request's first token came with a step shared with
requests behind it. RECORDS is a `kvroute simulate --records` run of one policy; FT the stderr of
the same run with ftprint.patch applied and KVR_DBGFT=1 (one line per first token: id, its last
chunk, the step's prefill tokens, decodes, step ms, end ms). Per request, the tokens of requests
behind it in that step are the step's prefill less the chunks of every request whose first token
came with it (same instance, same end); their cost is estimated at 61 us a token (the linear
term of llama3-70b-h100-tp4, attention left out). docs/results.md, "The scorecard", round 10."""
import sys
from steps import load as steps_load
recs, ft, steps = steps_load(sys.argv[1], sys.argv[2])
rows = []
for i, (c, p, dt, end) in ft.items():
    behind = p - steps[(recs[i]["endpoint"], end)]
    rows.append((recs[i]["ttft_ms"], behind, dt, i))
rows.sort(reverse=True)
n = len(rows)
def summ(rs, name):
    sh = [r for r in rs if r[1] > 0]
    d = sum(r[1] * 0.061 for r in rs)
    print("%s: %d requests, %d with a shared last step (%.0f%%), behind tokens mean %.0f, est. delay %.1f ms per request (%.1f%% of TTFT)" % (
        name, len(rs), len(sh), 100 * len(sh) / len(rs), sum(r[1] for r in rs) / len(rs), d / len(rs), 100 * d / sum(r[0] for r in rs)))
summ(rows, "all")
summ(rows[:max(1, n // 100)], "slowest 1%")
summ(rows[:max(1, n // 10)], "slowest 10%")
print("slowest 10: ttft behind step_ms", [(round(r[0]), r[1], r[2]) for r in rows[:10]])
