#!/bin/sh
# cells.sh KVX BASEDIR OUTDIR VARIANT: prefix-aware alone, built with exp.patch (KVX), run with
# KVR_EXP=VARIANT (KVR_SHF, KVR_SHH pass through) on inference-perf seeds 1-5 (BASEDIR/ip.json),
# agentic+mixed seeds 1-5 (am.json) and all three on seeds 6-10 (x610.json): main's runs of
# every policy, made with the commands of docs/results.md; then the cells met, won and lost
# (move-or-wait/wl.py) and the ratios per scenario (new-group/ratios.py). Run from the
# repository root; about 40 s on a quiet 2-core machine.
set -e
KVX=$1 B=$2 X=$3 V=$4
D=$(dirname "$0")/..
for s in "ip inference-perf 1-5" "am agentic,mixed 1-5" "x610 inference-perf,agentic,mixed 6-10"; do
  set -- $s
  KVR_EXP=$V nice -n 19 "$KVX" simulate --scorecard --scenarios "$2" --seeds "$3" --policies prefix-aware --json > "$X/$V.$1.json"
  echo "== $V $1: $(python3 "$D/move-or-wait/wl.py" "$B/$1.json" "$X/$V.$1.json" | tr '\n' ';')"
  python3 "$D/new-group/ratios.py" "$B/$1.json" "$X/$V.$1.json" | sed -n "\#$X/#,\$p" | tail -n +2
done
