#!/usr/bin/env python3
"""whatif.py RECORDS.jsonl SESSIONS.txt SESSION [POLICY]: the cell's imbalance as the scorecard
counts it (busy = the union of an instance's requests' [arrival, finish] spans, which matches the
simulator's busy time to the digit on these cells; instances 4-7 from the add at half the
arrivals' span), and what it would be with SESSION's requests, at the same times, on each other
instance instead: how much one session's placement decides the cell."""
import json, sys
pol = sys.argv[4] if len(sys.argv) > 4 else 'prefix-aware'
sess = dict(l.split() for l in open(sys.argv[2]))
recs = [x for x in (json.loads(l) for l in open(sys.argv[1])) if x['policy'] == pol]
t0 = min(x['arrival_ms'] for x in recs)
add = t0 + (max(x['arrival_ms'] for x in recs) - t0) / 2
end = max(x['finish_ms'] for x in recs)
ep = lambda x: int(x['endpoint'].split('-')[1])
start = [t0] * 4 + [add] * 4

def union(iv):
    tot, cur = 0.0, None
    for a, b in sorted(iv):
        if cur is None or a > cur[1]:
            if cur: tot += cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    if cur: tot += cur[1] - cur[0]
    return tot

def imb(where):
    busy = []
    for i in range(8):
        iv = [(x['arrival_ms'], x['finish_ms']) for x in recs if where(x) == i]
        busy.append(union(iv) / (end - start[i]))
    m = sum(busy) / 8
    return max(busy) / m, busy

i0, b0 = imb(ep)
print('as run: imbalance %.3f busy %s' % (i0, [round(b, 3) for b in b0]))
s = sys.argv[3]
for j in range(8):
    i1, b1 = imb(lambda x: j if sess[x['id']] == s else ep(x))
    print('%s on %d: imbalance %.3f busy %s' % (s, j, i1, [round(b, 3) for b in b1]))
