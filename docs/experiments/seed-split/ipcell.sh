#!/bin/sh
# ipcell.sh BASE.json BIN SHAPE LOAD SEED POLICIES RECORDS: one inference-perf cell of the scorecard
# (SHAPE 150x5 or 83x3; the speed-up read from BASE.json, a --scorecard --json run) replayed by
# `simulate` with per-request records; the TTFT figures are the scorecard cell's to the digit.
set -e
BASE=$1 BIN=$2 SH=$3 L=$4 S=$5 P=$6 R=$7
case $SH in
150x5) W=shared-prefix:groups=150,prompts=5,system=6000,question=1200,output=1000 N=8;;
83x3) W=shared-prefix:groups=83,prompts=3,system=8000,question=1000,output=1000 N=4;;
esac
SP=$(python3 -c "
import json,sys; d=json.load(open(sys.argv[1]))
print(repr([c['speedup'] for c in d['cells'] if c['scenario']=='inference-perf '+sys.argv[4] and c['load']==float(sys.argv[2]) and c['seed']==int(sys.argv[3])][0]))" "$BASE" "$L" "$S" "$SH")
exec nice -n 19 "$BIN" simulate --workload "$W" --instances $N --profile llama3-70b-h100-tp4 --speedup "$SP" --seed "$S" --policies "$P" --json --records "$R"
