#!/usr/bin/env bash
# scripts/longctx.sh: the live router's CPU per request at long prompts (issue #16).
#
#   bash scripts/longctx.sh                 # 10k, 32k and 100k tokens, each twice
#   SIZES=100000 REPEAT=3 bash scripts/longctx.sh
#
# It builds kvroute, starts four `kvroute sim --profile instant` engines and `kvroute serve
# --pprof` in front of them, all on loopback with free ports, and for each prompt size sends
# `kvroute bench --workload shared-prefix:...` (4 groups whose system prompt is the size less a
# 2,000-token question; the generated text has paragraph breaks, which the default normalisation
# collapses). The router's CPU is utime + stime from /proc/PID/stat (children excluded) before
# and after the run; the same reading over an idle stretch of the same wall time right after
# (health probes, scrapes) is subtracted; what is left, divided by the requests sent, is
# printed as cpu-ms per request. At the end one more 100k-token run is profiled through
# /debug/pprof/profile (profiling costs CPU too, so that run is not one of the figures) and its
# top functions are printed; the profile is kept in OUT. So is what that run allocated: the heap
# profile's allocation counts (/debug/pprof/allocs) before and after it, of which the
# difference's top allocators by bytes are printed (allocs-before.prof, allocs-after.prof).
#
# With PERF=1 (and perf installed), each run and each idle stretch is also counted by `perf stat
# -e context-switches,raw_syscalls:sys_enter` on the router, and the context switches and system
# calls per request (idle subtracted the same way) are printed in two more columns, and a third,
# task_ms_per_req: the router's task-clock over the same windows, idle subtracted, per request
# (perf's count in nanoseconds, where /proc's utime + stime come in ticks of 10 ms, 0.08 ms per
# request of a 128-request run). The syscall
# tracepoint costs the router a little CPU of its own: compare cpu_ms_per_req between runs with
# the same PERF. PERF_EVENTS (with PERF=1) names more perf events, comma-separated, e.g.
# "syscalls:sys_enter_nanosleep,syscalls:sys_enter_futex": each gets a column of its own, per
# request, idle subtracted the same way. PERF_RECORD=1 (with PERF=1) also samples the router with
# `perf record -g -F PERF_FREQ` (2000) over each run and idle stretch, into OUT/perf-LABEL.data
# (`perf report -i FILE`), and at the end prints, per request, where the samples of runs 2 to
# REPEAT went (classes by the functions on their stacks, idle subtracted; needs python3); the
# sampling costs CPU, so such runs' figures are not comparable with others'.
#
# Environment: SIZES (prompt tokens, "10000 32000 100000"), REPEAT (2), REQUESTS (128 per run),
# RATE (8 requests/s), CONCURRENCY (0; N: `kvroute bench --concurrency N`, a closed loop that keeps
# N requests in flight whatever RATE says, so that requests overlap), PERF (0), OUT (a new folder under /tmp), PROFILE (1: take the profile; 0: not),
# PROFILE_SIZE (prompt tokens of the profiled run, 100000), SHAPE (shared-prefix, or multi-turn:
# 8 conversations of 16 turns whose prompts grow by a turn each, so that Chains applies),
# KVROUTE (a built binary; default: built from this tree), USAGE (1; 0: streamed requests
# without stream_options.include_usage, `kvroute bench --no-usage`, so the router splices it in),
# SALT (0; 1: the router runs with one tenant, whose key bench sends, so every request gets the
# tenant's cache_salt: the config is written to OUT/kvroute.yaml, the secret and key made up
# for the run), BENCH (the binary that sends: default KVROUTE, so that an older router can be
# measured with a newer bench). Linux only (/proc).
set -euo pipefail

sizes=${SIZES:-"10000 32000 100000"}
repeat=${REPEAT:-2}
requests=${REQUESTS:-128}
rate=${RATE:-8}
concurrency=${CONCURRENCY:-0}
profile=${PROFILE:-1}
perf=${PERF:-0}
perf_events=${PERF_EVENTS:-}
perf_record=${PERF_RECORD:-0}
if [ "$perf" = 1 ] && ! command -v perf >/dev/null; then
	echo "longctx.sh: PERF=1 needs perf" >&2
	exit 1
fi
shape=${SHAPE:-shared-prefix}
usage=${USAGE:-1}
salt=${SALT:-0}
profile_size=${PROFILE_SIZE:-100000}
out=${OUT:-$(mktemp -d /tmp/kvroute-longctx.XXXXXX)}
mkdir -p "$out"
say() { echo "longctx.sh: $*" >&2; }

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${KVROUTE:-}
if [ -z "$bin" ]; then
	bin=$out/kvroute
	(cd "$root" && go build -o "$bin" ./cmd/kvroute)
fi
bench=${BENCH:-$bin}

pids=()
cleanup() {
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
	done
	for p in "${pids[@]}"; do
		wait "$p" 2>/dev/null || true
	done
}
trap cleanup EXIT

# wait_for FILE PATTERN COUNT: until FILE has COUNT lines matching PATTERN, at most 30 s.
wait_for() {
	local deadline=$((SECONDS + 30)) n
	until n=$(grep -c "$2" "$1" 2>/dev/null); [ "${n:-0}" -ge "$3" ]; do
		if [ $SECONDS -ge $deadline ]; then
			say "timed out waiting for '$2' in $1:"
			cat "$1" >&2
			exit 1
		fi
		sleep 0.1
	done
}

"$bin" sim --instances 4 --port 0 --profile instant >"$out/sim.log" 2>&1 &
pids+=($!)
wait_for "$out/sim.log" '^instance [0-9]*: http' 4
endpoints=()
for u in $(sed -n 's/^instance [0-9]*: \(http[^ ]*\).*/\1/p' "$out/sim.log"); do
	endpoints+=(--endpoint "$u")
done

bench_flags=()
[ "$usage" = 0 ] && bench_flags+=(--no-usage)
[ "$concurrency" != 0 ] && bench_flags+=(--concurrency "$concurrency")
serve_from=("${endpoints[@]}" --engine vllm)
if [ "$salt" = 1 ]; then
	key=sk-longctx-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
	KVROUTE_LONGCTX_SECRET=$(head -c 32 /dev/urandom | base64)
	export KVROUTE_LONGCTX_SECRET
	{
		echo "endpoints:"
		for u in $(sed -n 's/^instance [0-9]*: \(http[^ ]*\).*/\1/p' "$out/sim.log"); do
			echo "  - {url: \"$u\", engine: vllm}"
		done
		echo "auth: {mode: api_key, secret_env: KVROUTE_LONGCTX_SECRET}"
		echo "tenants:"
		echo "  - {name: longctx, api_keys: [\"$("$bin" hash-key --key "$key")\"]}"
	} >"$out/kvroute.yaml"
	serve_from=(--config "$out/kvroute.yaml")
	bench_flags+=(--api-key "$key")
fi

"$bin" serve "${serve_from[@]}" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
	--pprof --log-format json >"$out/serve.log" 2>&1 &
router=$!
pids+=($router)
wait_for "$out/serve.log" 'kvroute serve: api' 1
api=$(sed -n 's/.*kvroute serve: api \([^ ]*\) admin \([^ ]*\).*/\1/p' "$out/serve.log")
admin=$(sed -n 's/.*kvroute serve: api \([^ ]*\) admin \([^ ]*\).*/\2/p' "$out/serve.log")
deadline=$((SECONDS + 30))
until curl -fsS "$admin/readyz" >/dev/null 2>&1; do
	if [ $SECONDS -ge $deadline ]; then
		say "the router never became ready"
		cat "$out/serve.log" >&2
		exit 1
	fi
	sleep 0.1
done

tck=$(getconf CLK_TCK)
# cpu: the router's utime + stime in clock ticks (fields 14 and 15; the command name, field 2,
# is in parentheses and has no space here).
cpu() { awk '{print $14 + $15}' "/proc/$router/stat"; }
# sys: the router's stime alone.
sys() { awk '{print $15}' "/proc/$router/stat"; }
now_ms() { date +%s%3N; }

# perf_start FILE / perf_stop: count the router's context switches and system calls into FILE
# (PERF=1); perf_counts FILE prints "context_switches syscalls task_clock_ms" and the
# PERF_EVENTS counts (0 0 0 without PERF).
perf_pid=
record_pid=
perf_start() {
	[ "$perf" = 1 ] || return 0
	perf stat -x, -e "context-switches,raw_syscalls:sys_enter,task-clock${perf_events:+,$perf_events}" -p "$router" -o "$1" 2>/dev/null &
	perf_pid=$!
	pids+=($perf_pid)
	if [ "$perf_record" = 1 ]; then
		perf record -q -g -F "${PERF_FREQ:-2000}" -p "$router" -o "${1%.txt}.data" >/dev/null 2>&1 &
		record_pid=$!
		pids+=($record_pid)
	fi
	sleep 0.2 # perf attaches
}
perf_stop() {
	[ "$perf" = 1 ] || return 0
	kill -INT "$perf_pid" 2>/dev/null || true
	wait "$perf_pid" 2>/dev/null || true
	if [ -n "$record_pid" ]; then
		kill -INT "$record_pid" 2>/dev/null || true
		wait "$record_pid" 2>/dev/null || true
		record_pid=
	fi
}
perf_counts() {
	if [ "$perf" != 1 ]; then
		echo "0 0 0"
		return
	fi
	awk -F, -v extra="$perf_events" 'BEGIN{n = split(extra, ev, ",")}
		$3 == "context-switches"{c=$1} $3 == "raw_syscalls:sys_enter"{s=$1} $3 == "task-clock"{t=$1}
		{for (i = 1; i <= n; i++) if ($3 == ev[i]) x[i] = $1}
		END{printf "%d %d %.3f", c, s, t; for (i = 1; i <= n; i++) printf " %d", x[i]; print ""}' "$1"
}

# run SIZE LABEL: one bench run of REQUESTS prompts of SIZE tokens; prints "wall_ms cpu_ticks
# completed sys_ticks".
run() {
	local size=$1 label=$2 groups=4
	local prompts=$(((requests + groups - 1) / groups))
	local wl="shared-prefix:groups=$groups,prompts=$prompts,system=$((size - 2000)),question=2000,output=8,rate=$rate,n=$requests"
	if [ "$shape" = multi-turn ]; then
		# Conversations whose own prefix is about size - 2,500 tokens, growing by a user turn and
		# an answer each turn; the answer-time estimate made short (prefill=) so turns follow.
		wl="multi-turn:conversations=8,min-turns=16,max-turns=16,common=500,prefix-mean=$((size - 3000)),prefix-max=$((size - 2500)),min-output=8,max-output=8,think=0s,prefill=100000000,rate=$rate,n=$requests"
	fi
	local c0 t0 c1 t1 s0 s1
	perf_start "$out/perf-$label.txt"
	c0=$(cpu)
	s0=$(sys)
	t0=$(now_ms)
	"$bench" bench --target "$api" --workload "$wl" "${bench_flags[@]}" --quiet --json --seed "$((RANDOM + 1))" >"$out/bench-$label.json" 2>"$out/bench-$label.err"
	t1=$(now_ms)
	c1=$(cpu)
	s1=$(sys)
	perf_stop
	local done failed
	done=$(grep -o '"completed": *[0-9]*' "$out/bench-$label.json" | head -1 | grep -o '[0-9]*$')
	failed=$(grep -o '"failed": *[0-9]*' "$out/bench-$label.json" | head -1 | grep -o '[0-9]*$')
	if [ "${failed:-1}" != 0 ] || [ -z "$done" ]; then
		say "run $label: ${failed:-?} request(s) failed (see $out/bench-$label.json and serve.log)"
		exit 1
	fi
	echo "$((t1 - t0)) $((c1 - c0)) $done $((s1 - s0))"
}

say "output in $out; load average: $(cut -d' ' -f1-3 /proc/loadavg); rate $rate requests/s; concurrency $concurrency; USAGE=$usage SALT=$salt"
printf '%-8s %-3s %8s %8s %10s %10s %11s %14s' tokens run requests wall_s cpu_ms "(sys_ms)" idle_cpu_ms cpu_ms_per_req
if [ "$perf" = 1 ]; then
	printf ' %10s %12s %15s' cs_per_req syscalls_per_req task_ms_per_req
	for e in ${perf_events//,/ }; do printf ' %s' "${e#syscalls:sys_enter_}"; done
fi
echo
for size in $sizes; do
	for i in $(seq 1 "$repeat"); do
		res=$(run "$size" "$size-$i")
		read -r wall ticks sent systicks <<<"$res"
		# The idle rate over the same wall time, right after.
		perf_start "$out/perf-$size-$i-idle.txt"
		c0=$(cpu)
		sleep "$(awk -v w="$wall" 'BEGIN{printf "%.3f", w/1000}')"
		c1=$(cpu)
		perf_stop
		idle=$((c1 - c0))
		counts=$(perf_counts "$out/perf-$size-$i.txt")
		icounts=$(perf_counts "$out/perf-$size-$i-idle.txt")
		read -r cs sc tc _ <<<"$counts"
		read -r ics isc itc _ <<<"$icounts"
		awk -v s="$size" -v i="$i" -v n="$sent" -v w="$wall" -v t="$ticks" -v d="$idle" -v hz="$tck" -v k="$systicks" \
			-v perf="$perf" -v cs="$cs" -v sc="$sc" -v ics="$ics" -v isc="$isc" -v tc="$tc" -v itc="$itc" -v counts="$counts" -v icounts="$icounts" 'BEGIN{
			busy = t * 1000 / hz; idle = d * 1000 / hz
			printf "%-8s %-3s %8d %8.1f %10.0f %10.0f %11.0f %14.2f", s, i, n, w / 1000, busy, k * 1000 / hz, idle, (busy - idle) / n
			if (perf == 1) {
				printf " %10.1f %12.1f %15.3f", (cs - ics) / n, (sc - isc) / n, (tc - itc) / n
				k = split(counts, a, " "); split(icounts, b, " ")
				for (j = 4; j <= k; j++) printf " %.1f", (a[j] - b[j]) / n
			}
			printf "\n"
		}'
	done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# With PERF_RECORD=1: the samples of runs 2 to REPEAT (all of them when REPEAT is 1), each less its
# idle stretch's, per request, in classes by the functions on their stacks; each sample goes to
# the first class of the list that matches.
if [ "$perf" = 1 ] && [ "$perf_record" = 1 ] && command -v python3 >/dev/null; then
	say "where the samples go (perf record -F ${PERF_FREQ:-2000}), per request, idle subtracted:"
	for size in $sizes; do
		files=()
		for i in $(seq "$((repeat > 1 ? 2 : 1))" "$repeat"); do
			files+=("$out/perf-$size-$i.data" "$out/perf-$size-$i-idle.data")
		done
		echo "$size tokens:"
		python3 - "${PERF_FREQ:-2000}" "$requests" "${files[@]}" <<'PY'
import collections, subprocess, sys
freq, n, files = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
def has(*names):
    return lambda st: any(any(k in f for k in names) for f in st)
classes = [
    ("collector (mark workers, assists, sweeping)", has('gcBgMarkWorker', 'runtime.gcAssist', 'sweepone', 'bgsweep', 'bgscavenge')),
    ("idle work: scrapes of the engines' metrics", has('internal/scrape', 'expfmt')),
    ("idle work: health probes (net/http client)", has('net/http.(*persistConn)', 'net/http.(*Transport)')),
    ("runtime: sysmon", lambda st: 'runtime.sysmon' in st),
    ("page faults (kernel), wherever they occur", has('exc_page_fault')),
    ("handler: routing keys (route.Keys.FromOpenAI)", has('route.Keys.FromOpenAI')),
    ("handler: parse (openai.ParseScratch)", has('openai.ParseScratch')),
    ("handler: reading the body", has('proxy.readBodyHeld')),
    ("handler: pick and index insert (route.Call.Next)", has('route.(*Call).Next')),
    ("handler: done, index insert again (route.Call.Finish)", has('route.(*Call).Finish')),
    ("handler: the access line (slog, logbuf, write)", has('log/slog', 'logbuf')),
    ("handler: sending to the engine (h1.Transport)", lambda st: has('h1.(*Transport)')(st) and not has('proxy.(*sseBody)')(st)),
    ("handler: the rest (relay, metrics, settle)", has('proxy.(*Handler).ServeHTTP')),
    ("h1 server outside the handler", has('internal/h1')),
    ("runtime: scheduler (netpoll, findRunnable, park)", lambda st: any(f in ('runtime.findRunnable', 'runtime.schedule', 'runtime.park_m', 'runtime.netpoll', 'runtime.stopm', 'runtime.mstart1', 'runtime.goexit0') or 'runtime.mcall' in f for f in st)),
    ("other", lambda st: True),
]
def count(path):
    out = subprocess.run(['perf', 'script', '-i', path, '-F', 'ip,sym'], capture_output=True, text=True).stdout
    got = collections.Counter()
    for sample in out.split('\n\n'):
        st = [l.split(None, 1)[1] for l in sample.strip().splitlines() if len(l.split(None, 1)) == 2]
        if st:
            got[next(name for name, match in classes if match(st))] += 1
    return got
diff, runs = collections.Counter(), len(files) // 2
for run, idle in zip(files[0::2], files[1::2]):
    diff.update(count(run))
    diff.subtract(count(idle))
ms = 1000 / freq / (n * runs)
for name, _ in classes:
    print(f"  {name:56s} {diff[name] * ms:7.3f} ms")
print(f"  {'all samples':56s} {sum(diff.values()) * ms:7.3f} ms")
PY
	done
fi

if [ "$profile" = 1 ]; then
	secs=$((requests / rate + 2))
	curl -fsS -o "$out/allocs-before.prof" "$admin/debug/pprof/allocs"
	curl -fsS -o "$out/cpu.prof" "$admin/debug/pprof/profile?seconds=$secs" &
	prof=$!
	res=$(run "$profile_size" profile)
	wait "$prof"
	curl -fsS -o "$out/allocs-after.prof" "$admin/debug/pprof/allocs"
	read -r wall ticks sent systicks <<<"$res"
	say "CPU profile of one more run of $profile_size-token prompts: $out/cpu.prof ($((ticks * 1000 / tck)) cpu-ms by /proc over ${wall} ms, idle not subtracted)"
	if command -v go >/dev/null; then
		go tool pprof -top -nodecount=25 "$bin" "$out/cpu.prof" 2>/dev/null | sed -n '1,32p'
		say "bytes allocated during that run (allocs-after.prof less allocs-before.prof), $sent requests:"
		go tool pprof -sample_index=alloc_space -top -nodecount=20 -base "$out/allocs-before.prof" "$bin" "$out/allocs-after.prof" 2>/dev/null | sed -n '1,27p'
	fi
fi
