#!/usr/bin/env python3
"""spread.py BASE.json CAND.json ...: per scenario, prefix-aware's cells summed up over the seeds
of each run (BASE's own prefix-aware first, then each CAND's, judged against BASE's other
policies by new-prefix/judge.py): the mean and standard deviation of the imbalance, how many
cells are over 1.2, the mean TTFT mean and p99 ratios and the mean hit rate: whether a variant
moves the imbalance as a whole or only reshuffles which cells cross 1.2."""
import os, statistics, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "new-prefix"))
from cells import runs
for name0, by in runs(sys.argv[1], sys.argv[2:]):
    print(name0)
    for name, v in by.items():
        imb = [x[2] for x in v]
        print("  %-22s cells %2d  imbalance %.3f +- %.3f, over 1.2: %d  mean %.3f  p99 %.3f  hit %.4f" % (
            name, len(v), statistics.mean(imb), statistics.stdev(imb), sum(x > 1.2 for x in imb),
            statistics.mean(x[0] for x in v), statistics.mean(x[1] for x in v), statistics.mean(x[3] for x in v)))
