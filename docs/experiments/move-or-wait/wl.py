#!/usr/bin/env python3
"""wl.py BASE.json CAND.json: cells met by CAND's prefix-aware (a one-policy run, as for
judge.py), and the cells it won and lost against BASE's own prefix-aware."""
import os, subprocess, sys
J = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'new-prefix', 'judge.py')
def verdicts(args):
    out = subprocess.run([sys.executable, J] + args, capture_output=True, text=True, check=True).stdout
    return {l[:31].strip(): l.rstrip().endswith(' ok') for l in out.splitlines() if ' ok' in l or 'MISS' in l}
b, c = verdicts([sys.argv[1]]), verdicts(sys.argv[1:3])
won = [k for k in c if c[k] and not b[k]]
lost = [k for k in c if b[k] and not c[k]]
print('met %d of %d (base %d), won %d, lost %d' % (sum(c.values()), len(c), sum(b[k] for k in c), len(won), len(lost)))
for k in lost: print('  lost', ' '.join(k.split()))
for k in won: print('  won ', ' '.join(k.split()))
