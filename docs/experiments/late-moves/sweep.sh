#!/bin/sh
# sweep.sh OLD NEW EXP DIR LOAD...: the Mooncake trace (S1's fleet: 8 instances, llama3-70b-h200-tp8)
# at each LOAD under two builds, OLD and NEW, and under EXP (tail.patch) with KVR_EXP=dbg for the
# requests the round-14 rule decided: DIR/old.LOAD.json, DIR/new.LOAD.json, DIR/dbg.LOAD.err.
# Each load replays the same trace at another rate: another draw of which requests the rule
# decides and of what follows from them (sweep.py reads DIR). Run from the repository root.
set -e
OLD=$1 NEW=$2 EXP=$3 DIR=$4; shift 4
mkdir -p "$DIR"
T=../shared/traces/mooncake/conversation_trace.jsonl
for L in "$@"; do
  nice -n 19 "$OLD" simulate --trace $T --instances 8 --profile llama3-70b-h200-tp8 --load "$L" --policies prefix-aware --json > "$DIR/old.$L.json" &
  nice -n 19 "$NEW" simulate --trace $T --instances 8 --profile llama3-70b-h200-tp8 --load "$L" --policies prefix-aware --json > "$DIR/new.$L.json" &
  KVR_EXP=dbg nice -n 19 "$EXP" simulate --trace $T --instances 8 --profile llama3-70b-h200-tp8 --load "$L" --policies prefix-aware --json > /dev/null 2> "$DIR/dbg.$L.err"
  wait
done
