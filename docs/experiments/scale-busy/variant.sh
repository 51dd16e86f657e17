#!/bin/sh
# variant.sh KVX BASE.json VARIANT SCENARIOS SEEDS OUT.json: prefix-aware alone, built with
# exp.patch (KVX) and run with KVR_EXP=VARIANT on the scorecard's SCENARIOS over SEEDS, written
# to OUT.json; then the cells it meets, won and lost against BASE.json (a run of every policy on
# the same cells: move-or-wait/wl.py) and, per scenario, the imbalance's mean, spread and cells
# over 1.2 with the mean TTFT ratios and hit rate (spread.py). Run from the repository root.
set -e
KVX=$1 BASE=$2 V=$3 SC=$4 SEEDS=$5 OUT=$6
D=$(dirname "$0")
KVR_EXP=$V nice -n 19 "$KVX" simulate --scorecard --scenarios "$SC" --seeds "$SEEDS" \
  --trace ../shared/traces/mooncake/conversation_trace.jsonl --policies prefix-aware --json > "$OUT"
python3 "$D/../move-or-wait/wl.py" "$BASE" "$OUT"
python3 "$D/spread.py" "$BASE" "$OUT"
