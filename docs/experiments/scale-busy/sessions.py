#!/usr/bin/env python3
"""sessions.py SIM.json RECORDS.jsonl SESSIONS.txt [POLICY]: for an agentic scale-up cell run by
move-or-wait/cell.sh, per instance: its busy fraction over its own time in the fleet (the
simulator's, and the union of its requests' [arrival, finish] spans, which should be near it),
the same union before and after the add, its sessions (started there, moved in, moved out), its
requests and their uncached tokens; then every move (a session's request placed on another
instance than its previous turn), with its time and the tokens it recomputed. SESSIONS.txt is
"ID SESSION" a line (scale-busy.patch's cmd/zzsess)."""
import collections, json, sys
d = json.load(open(sys.argv[1]))
pol = sys.argv[4] if len(sys.argv) > 4 else 'prefix-aware'
sess = dict(l.split() for l in open(sys.argv[3]))
recs = sorted((json.loads(l) for l in open(sys.argv[2])), key=lambda x: x['arrival_ms'])
recs = [x for x in recs if x['policy'] == pol]
res = [r for r in d['results'] if r['policy'] == pol][0]
t0 = min(x['arrival_ms'] for x in recs)
add = t0 + (max(x['arrival_ms'] for x in recs) - t0) / 2
end = max(x['finish_ms'] for x in recs)
n = len(res['instance_busy_fraction'])
start = [t0 if i < 4 else add for i in range(n)]
own = [b * (end - t0) / (end - start[i]) for i, b in enumerate(res['instance_busy_fraction'])]
mean = sum(own) / n
print('%s: add at %.1f s, end %.1f s, imbalance %.3f (max %.3f / mean %.3f)' % (pol, add / 1e3, end / 1e3, max(own) / mean, max(own), mean))

def union(iv, lo, hi):
    tot, cur = 0.0, None
    for a, b in sorted(iv):
        a, b = max(a, lo), min(b, hi)
        if b <= a:
            continue
        if cur is None or a > cur[1]:
            if cur: tot += cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    if cur: tot += cur[1] - cur[0]
    return tot

ep = lambda x: int(x['endpoint'].split('-')[1])
byi = collections.defaultdict(list)
last = {}
started = collections.defaultdict(list)
moves = []
movedin, movedout = collections.Counter(), collections.Counter()
for x in recs:
    s, i = sess[x['id']], ep(x)
    byi[i].append(x)
    if s not in last:
        started[i].append((x['arrival_ms'], s))
    elif last[s] != i:
        moves.append((x['arrival_ms'], s, last[s], i, x['prompt_tokens'] - (x['cached_tokens'] or 0), x['ttft_ms']))
        movedin[i] += 1
        movedout[last[s]] += 1
    last[s] = i
print('inst  busy(sim) union  before  after  sessions started (before/after add)  moved in/out  requests  uncached tokens  mean TTFT ms')
for i in range(n):
    iv = [(x['arrival_ms'], x['finish_ms']) for x in byi[i]]
    u = union(iv, start[i], end) / (end - start[i])
    ub = union(iv, t0, add) / (add - t0) if i < 4 else float('nan')
    ua = union(iv, add, end) / (end - add)
    sb = sum(1 for t, _ in started[i] if t < add)
    sa = len(started[i]) - sb
    unc = sum(x['prompt_tokens'] - (x['cached_tokens'] or 0) for x in byi[i])
    tt = sum(x['ttft_ms'] for x in byi[i]) / max(len(byi[i]), 1)
    print('%4d  %.3f     %.3f  %.3f   %.3f  %2d (%2d/%2d)  %2d/%2d  %4d  %7d  %.1f' % (i, own[i], u, ub, ua, sb + sa, sb, sa, movedin[i], movedout[i], len(byi[i]), unc, tt))
print('moves: %d' % len(moves))
for t, s, a, b, u, tt in moves:
    print('  %7.1f s  %-16s %d -> %d  uncached %5d  ttft %.0f ms' % (t / 1e3, s, a, b, u, tt))
