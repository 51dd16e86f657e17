#!/usr/bin/env python3
"""spread.py BASE.json CAND.json ...: per scenario, prefix-aware's cells summed up over the seeds
of each run (BASE's own prefix-aware first, then each CAND's, judged against BASE's other
policies by new-prefix/judge.py): the mean and standard deviation of the imbalance, how many
cells are over 1.2, the mean TTFT mean and p99 ratios and the mean hit rate: whether a variant
moves the imbalance as a whole or only reshuffles which cells cross 1.2."""
import os, statistics, subprocess, sys
J = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "new-prefix", "judge.py")
for cand in [None] + sys.argv[2:]:
    out = subprocess.run([sys.executable, J, sys.argv[1]] + ([cand] if cand else []),
                         capture_output=True, text=True, check=True).stdout
    by = {}
    for line in out.splitlines():
        if " mean " not in line:
            continue
        f = line.split()
        i = f.index("mean")
        by.setdefault(" ".join(f[:i - 2]), []).append(
            (float(f[i + 1]), float(f[i + 3]), float(f[i + 5]), float(f[i + 7])))
    print(cand or sys.argv[1])
    for name, v in by.items():
        imb = [x[2] for x in v]
        print("  %-22s cells %2d  imbalance %.3f +- %.3f, over 1.2: %d  mean %.3f  p99 %.3f  hit %.4f" % (
            name, len(v), statistics.mean(imb), statistics.stdev(imb), sum(x > 1.2 for x in imb),
            statistics.mean(x[0] for x in v), statistics.mean(x[1] for x in v), statistics.mean(x[3] for x in v)))
