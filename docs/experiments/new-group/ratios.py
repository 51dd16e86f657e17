#!/usr/bin/env python3
"""ratios.py BASE.json [CAND.json ...]: judge.py's per-cell ratios summed up per scenario: the mean
and largest TTFT mean ratio, p99 ratio and imbalance of prefix-aware over the cells (BASE's own
prefix-aware, then each CAND's, as judge.py takes them). A variant that wins every cell needs
the mean ratio well below 1.02, since the per-cell ratios scatter (docs/results.md, round 9)."""
import os, statistics, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "new-prefix"))
from cells import runs
for name0, by in runs(sys.argv[1], sys.argv[2:]):
    print(name0)
    for name, v in by.items():
        print("  %-22s mean %.3f (max %.3f)  p99 %.3f (max %.3f)  imbalance max %.3f" % (
            name, statistics.mean(x[0] for x in v), max(x[0] for x in v),
            statistics.mean(x[1] for x in v), max(x[1] for x in v), max(x[2] for x in v)))
