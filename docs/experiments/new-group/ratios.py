#!/usr/bin/env python3
"""ratios.py BASE.json [CAND.json ...]: judge.py's per-cell ratios summed up per scenario: the mean
and largest TTFT mean ratio, p99 ratio and imbalance of prefix-aware over the cells (BASE's own
prefix-aware, then each CAND's, as judge.py takes them). A variant that wins every cell needs
the mean ratio well below 1.02, since the per-cell ratios scatter (docs/results.md, round 9)."""
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
        name = " ".join(f[:i - 2])
        by.setdefault(name, []).append((float(f[i + 1]), float(f[i + 3]), float(f[i + 5])))
    print(cand or sys.argv[1])
    for name, v in by.items():
        print("  %-22s mean %.3f (max %.3f)  p99 %.3f (max %.3f)  imbalance max %.3f" % (
            name, statistics.mean(x[0] for x in v), max(x[0] for x in v),
            statistics.mean(x[1] for x in v), max(x[1] for x in v), max(x[2] for x in v)))
