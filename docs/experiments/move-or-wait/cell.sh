#!/bin/sh
# cell.sh BASE.json BIN LOAD SEED POLICIES [RECORDS]: one agentic scale-up cell of the scorecard
# (the speed-up read from BASE.json, a --scorecard --json run), replayed by `simulate` so that
# per-instance figures and, with RECORDS, per-request records come out; the TTFT figures are the
# scorecard cell's to the digit. KVR_EXP passes through to an experiment build.
set -e
BASE=$1 BIN=$2 L=$3 S=$4 P=$5 R=$6
W="multi-turn:conversations=96,rate=0.5,min-turns=8,max-turns=24,common=3000,prefix-mean=2000,prefix-max=8000,min-user=100,max-user=1000,min-output=50,max-output=200,think=500ms"
SP=$(python3 -c "
import json,sys; d=json.load(open(sys.argv[1]))
print([c['speedup'] for c in d['cells'] if c['scenario']=='agentic scale-up' and c['load']==float(sys.argv[2]) and c['seed']==int(sys.argv[3])][0])" "$BASE" "$L" "$S")
exec "$BIN" simulate --workload "$W" --instances 8 --add 4@50% --add 5@50% --add 6@50% --add 7@50% \
  --speedup "$SP" --seed "$S" --policies "$P" --json ${R:+--records "$R"}
