#!/usr/bin/env bash
# scripts/soak.sh: a long run of three router replicas under load, to find what tests of one
# thing at a time miss: leaks (memory, goroutines, requests counted in flight that never end),
# requests lost at restarts, log noise. Loopback only; everything it starts is stopped on exit.
#
#   bash scripts/soak.sh [--faults] [SECONDS]      # default 480 s; writes into $SOAK_DIR
#
# What runs: `kvroute sim` with 4 instances (llama3-8b-h100-tp1 at --time-scale 0.5, 1 % of
# requests failed at once with 503); three `kvroute serve` replicas with peers (a static list,
# prefix-aware); one `kvroute bench` per replica at 40 requests/s (a shared-prefix workload);
# a client that drops a streamed answer 0.3 s in, round robin over the replicas. Then either:
# - (default) a graceful restart (SIGTERM, then started again) of one replica every 90 s, in
#   turn, up to a minute before the end; or
# - with --faults, no restart: every 20 s the next fault on instance 1 (hang, cut streams after 5
#   tokens, steps 3 x slower, refused connections, no prefix cache, then 60 s of none), and
#   replica r2 cut off from its peers for 40 s from 200 s in.
# Every 20 s, per replica: RSS, goroutines, requests in flight on the engines (the router's
# gauge) and /debug/peers' own and remote counts, into stats.txt. After the load, twice more
# (15 s and 45 s later): every count in flight should be 0 by then, everywhere.
#
# Environment: KV (the kvroute binary; default: built from this checkout into $SOAK_DIR),
# SOAK_DIR (default /tmp/kvroute-soak), SOAK_PORT (first of 40 ports; default 19100),
# SOAK_BENCH_ARGS (more flags for every bench, such as --non-streamed 0.5).
# Results: stats.txt, bench{1,2,3}.json (completed, failed by kind, hit rate), r{1,2,3}.log
# (warnings and errors), sim.log.
set -uo pipefail

faults=false
if [ "${1:-}" = "--faults" ]; then faults=true; shift; fi
dur=${1:-480}
dir=${SOAK_DIR:-/tmp/kvroute-soak}
base=${SOAK_PORT:-19100}
mkdir -p "$dir"
if [ -z "${KV:-}" ]; then
  KV=$dir/kvroute
  (cd "$(dirname "$0")/.." && go build -o "$KV" ./cmd/kvroute) || exit 1
fi
cd "$dir" && rm -f stats.txt ./*.log bench*.json bench*.err dropper.txt
export KVROUTE_PEERS_SECRET=soak-secret-0123456789abcdef0123456789

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  sleep 1
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
}
trap cleanup EXIT INT TERM

eng=$base           # engines: eng .. eng+3
api=$((base + 10))  # replica i: api+i, admin api+10+i, peer stream api+20+i, gossip api+30+i
admin=""
if $faults; then admin=--admin; fi
"$KV" sim --instances 4 --port "$eng" --profile llama3-8b-h100-tp1 --time-scale 0.5 --fail-rate 0.01 $admin > sim.log 2>&1 &
sim=$!; pids+=("$sim")
for i in 1 2 3; do
  cat > "r$i.yaml" <<YAML
listen: 127.0.0.1:$((api + i))
admin_listen: 127.0.0.1:$((api + 10 + i))
pprof: true
log: {level: warn}
auth: {mode: none}
endpoints:
  - {url: "http://127.0.0.1:$eng", engine: vllm}
  - {url: "http://127.0.0.1:$((eng + 1))", engine: vllm}
  - {url: "http://127.0.0.1:$((eng + 2))", engine: vllm}
  - {url: "http://127.0.0.1:$((eng + 3))", engine: vllm}
peers:
  listen: 127.0.0.1:$((api + 20 + i))
  gossip_listen: 127.0.0.1:$((api + 30 + i))
  name: r$i
  static: ["127.0.0.1:$((api + 31))", "127.0.0.1:$((api + 32))", "127.0.0.1:$((api + 33))"]
  secret_env: KVROUTE_PEERS_SECRET
  fault_injection: $faults
YAML
done
declare -A rp
start() {
  "$KV" serve --config "r$1.yaml" >> "r$1.log" 2>&1 &
  rp[$1]=$!; pids+=("${rp[$1]}")
}
for i in 1 2 3; do start "$i"; done
sleep 4
benches=()
for i in 1 2 3; do
  "$KV" bench --target "http://127.0.0.1:$((api + i))" --rate 40 --duration "${dur}s" --seed "$i" --quiet --json \
    --workload shared-prefix:groups=64,prompts=256,system=1500,question=200,output=64 ${SOAK_BENCH_ARGS:-} > "bench$i.json" 2> "bench$i.err" &
  benches+=($!); pids+=($!)
done
sys=$(printf 'sys %.0s' $(seq 1 300))
(
  end=$((SECONDS + dur)); n=0
  while [ $SECONDS -lt $end ]; do
    curl -sN -m 0.3 "http://127.0.0.1:$((api + n % 3 + 1))/v1/chat/completions" -d '{"model":"meta-llama/Llama-3.1-70B-Instruct","stream":true,"max_tokens":400,"messages":[{"role":"system","content":"'"$sys"'"},{"role":"user","content":"q'$n'"}]}' > /dev/null 2>&1
    n=$((n + 1))
  done
  echo "dropper sent $n" > dropper.txt
) &
dropper=$!; pids+=("$dropper")

stat() {
  for i in 1 2 3; do
    local a=127.0.0.1:$((api + 10 + i))
    local rss g inf peers
    rss=$(awk '/VmRSS/{print $2}' "/proc/${rp[$i]}/status" 2>/dev/null)
    g=$(curl -s -m 2 "$a/debug/pprof/goroutine?debug=1" | head -1 | awk '{print $4}')
    inf=$(curl -s -m 2 "$a/metrics" | awk '/^kvroute_endpoint_in_flight_requests/{s+=$2} END{print s+0}')
    peers=$(curl -s -m 2 "$a/debug/peers" | python3 -c 'import json,sys
try:
    d = json.load(sys.stdin); print("local", d.get("local_in_flight"), "remote", d.get("remote_in_flight"))
except Exception:
    print("-")')
    echo "$(date -u +%T) r$i pid ${rp[$i]} rss_kb $rss goroutines $g in_flight $inf peers $peers"
  done >> stats.txt
}

t0=$SECONDS; next=90; k=1
while [ $((SECONDS - t0)) -lt "$dur" ]; do
  sleep 20; stat
  el=$((SECONDS - t0))
  if $faults; then
    case $(( (el / 20) % 8 )) in
      1) f='{"hang":true}' ;; 2) f='{"hang":false,"cut_after":5}' ;; 3) f='{"cut_after":0,"slow":3}' ;;
      4) f='{"slow":1,"refuse":true}' ;; 5) f='{"refuse":false,"no_prefix_cache":true}' ;; *) f='{"no_prefix_cache":false}' ;;
    esac
    curl -s -m 2 -X POST "127.0.0.1:$((eng + 1))/admin/faults" -d "$f" > /dev/null
    echo "$(date -u +%T) faults on instance 1: $f" >> stats.txt
    if [ "$el" -ge 200 ] && [ "$el" -lt 240 ]; then
      curl -s -m 2 -X POST "127.0.0.1:$((api + 12))/debug/peers/isolate?on=true" > /dev/null && echo "$(date -u +%T) r2 isolated" >> stats.txt
    elif [ "$el" -ge 240 ]; then
      curl -s -m 2 -X POST "127.0.0.1:$((api + 12))/debug/peers/isolate?on=false" > /dev/null
    fi
  elif [ "$el" -ge "$next" ] && [ "$el" -lt $((dur - 60)) ]; then
    kill -TERM "${rp[$k]}"; wait "${rp[$k]}" 2>/dev/null
    echo "$(date -u +%T) r$k restarted" >> stats.txt
    start "$k"
    k=$((k % 3 + 1)); next=$((next + 90))
  fi
done
for b in "${benches[@]}"; do wait "$b"; done
wait "$dropper"
sleep 15; echo "after the load:" >> stats.txt; stat
sleep 30; echo "30 s later:" >> stats.txt; stat
for i in 1 2 3; do
  python3 - "bench$i.json" <<'PY' >> stats.txt
import json, sys
d = json.load(open(sys.argv[1]))
r, b = d["results"][0], d["bench"][0]
print(sys.argv[1], "completed", r["completed"], "failed", r["failed"], b.get("errors") or {}, "hit rate %.3f" % r["hit_rate"])
PY
done
cat dropper.txt >> stats.txt
echo "done: $dir/stats.txt"
