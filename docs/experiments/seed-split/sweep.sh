#!/bin/sh
# sweep.sh BIN OUTDIR GROUPSDIR BASE.json SEEDS...: every inference-perf cell of SEEDS (both shapes,
# three loads) replayed with records for prefix-aware and cache-aware (the speed-up read from
# BASE.json, a --scorecard --json run of those seeds; the TTFTs are the scorecard's to the digit),
# then collide.py on each: one line per cell. GROUPSDIR holds 150_SEED.txt and 83_SEED.txt
# (zzgroups.patch).
set -e
BIN=$1 OUT=$2 G=$3 BASE=$4; shift 4
D=$(dirname "$0")
mkdir -p "$OUT"
for S in "$@"; do for SH in 150x5 83x3; do for L in 0.5 0.7 0.9; do
  R="$OUT/${SH}_${S}_$L.jsonl"
  sh "$D/ipcell.sh" "$BASE" "$BIN" $SH $L $S prefix-aware,cache-aware "$R" > "$OUT/${SH}_${S}_$L.json"
  echo "== $SH $L s$S"
  python3 "$D/collide.py" "$R" "$G/${SH%x*}_$S.txt" prefix-aware cache-aware
done; done; done
