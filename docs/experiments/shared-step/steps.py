"""steps.py: what share.py and share2.py read. load(RECORDS, FT) returns the records by id, each
first token's (its last chunk, the step's prefill tokens, step ms, end ms) by id, and each
step's chunks of requests whose first token came with it, by (instance, end)."""
import collections
import json


def load(records, ftfile):
    recs = {r["id"]: r for r in map(json.loads, open(records))}
    ft = {}
    for line in open(ftfile):
        _, i, chunk, pre, dec, dt, end = line.split()
        ft[i] = (int(chunk), int(pre), float(dt), float(end))
    steps = collections.defaultdict(int)
    for i, (c, p, dt, end) in ft.items():
        steps[(recs[i]["endpoint"], end)] += c
    return recs, ft, steps
