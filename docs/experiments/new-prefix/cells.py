"""cells.py: judge.py's per-cell lines read back, for the scripts that sum them up per scenario
(new-group/ratios.py, scale-busy/spread.py)."""
import os, subprocess, sys
J = os.path.join(os.path.dirname(os.path.abspath(__file__)), "judge.py")


def runs(base, cands):
    """For BASE's own prefix-aware, then each CAND's (judged against BASE's other policies), the
    run's name and its cells by scenario: (TTFT mean ratio, p99 ratio, imbalance, hit rate)."""
    for cand in [None] + list(cands):
        out = subprocess.run([sys.executable, J, base] + ([cand] if cand else []),
                             capture_output=True, text=True, check=True).stdout
        by = {}
        for line in out.splitlines():
            if " mean " not in line:
                continue
            f = line.split()
            i = f.index("mean")
            by.setdefault(" ".join(f[:i - 2]), []).append(
                (float(f[i + 1]), float(f[i + 3]), float(f[i + 5]), float(f[i + 7])))
        yield cand or base, by
