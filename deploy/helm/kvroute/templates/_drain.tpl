{{/* How a pod stops: the preStop sleep, kvroute's drain delay and drain, and the grace period
and readiness probe that must leave room for them (docs/operations.md, "Starting and
stopping"). */}}

{{/* Seconds in one of the config's durations ((list key value): a Go duration such as 5s, 1m30s
or 500ms), as a number; fails naming key when value is not one. */}}
{{- define "kvroute.seconds" -}}
{{- $key := index . 0 -}}
{{- $v := toString (index . 1) -}}
{{- $part := "([0-9]+[.]?[0-9]*|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h)" -}}
{{- if eq $v "0" -}}
0
{{- else if regexMatch (printf "^(%s)+$" $part) $v -}}
{{- $unit := dict "h" 3600.0 "m" 60.0 "s" 1.0 "ms" 0.001 "us" 0.000001 "µs" 0.000001 "μs" 0.000001 "ns" 0.000000001 -}}
{{- $sum := 0.0 -}}
{{- range regexFindAll $part $v -1 -}}
{{- $n := regexFind "^[0-9.]+" . -}}
{{- $sum = addf $sum (mulf (float64 $n) (get $unit (trimPrefix $n .))) -}}
{{- end -}}
{{- $sum -}}
{{- else -}}
{{- fail (printf "%s: %q is not a duration: write it like 5s, 1m30s or 500ms" $key $v) -}}
{{- end -}}
{{- end -}}

{{/* The shutdown's figures, as JSON: drainDelay (config.server.drain_delay, kvroute's default 5s
when unset), drains (whether kvroute waits it out: only with a delay, and a readiness probe
that asks /readyz, since kvroute skips the delay when nobody asked), shutdown
(config.server.shutdown_timeout, default 30s), preStop (the sleep: preStopSleepSeconds, or
with auto 0 where the drain delay keeps the listeners open while the pod's endpoints update:
the API listener, and in endpointPicker mode the ext_proc listener, which takes new streams
for the same delay once /readyz was asked; else 5), and need (the seconds the whole takes at
most: the sleep, the delay, the drain, and 3 s for the cut requests' last second, the admin
server's and the exit; the API and ext_proc listeners drain side by side). */}}
{{- define "kvroute.shutdown" -}}
{{- $server := dig "server" dict (.Values.config | default dict) | default dict -}}
{{- $drain := 5.0 -}}
{{- if hasKey $server "drain_delay" -}}
{{- $drain = float64 (include "kvroute.seconds" (list "config.server.drain_delay" $server.drain_delay)) -}}
{{- end -}}
{{- $shutdown := 0.0 -}}
{{- if hasKey $server "shutdown_timeout" -}}
{{- $shutdown = float64 (include "kvroute.seconds" (list "config.server.shutdown_timeout" $server.shutdown_timeout)) -}}
{{- end -}}
{{- if eq $shutdown 0.0 -}}
{{- $shutdown = 30.0 -}}
{{- end -}}
{{- $probe := .Values.readinessProbe | default dict -}}
{{- $drains := and (gt $drain 0.0) (eq (dig "httpGet" "path" "" $probe) "/readyz") -}}
{{- $preStop := .Values.preStopSleepSeconds -}}
{{- if eq (toString $preStop) "auto" -}}
{{- $preStop = 5 -}}
{{- if $drains -}}
{{- $preStop = 0 -}}
{{- end -}}
{{- else if not (regexMatch "^[0-9]+$" (toString $preStop)) -}}
{{- fail (printf "preStopSleepSeconds: %q: give whole seconds (0: no sleep), or auto" (toString $preStop)) -}}
{{- end -}}
{{- $preStop = int $preStop -}}
{{- $need := addf $preStop $shutdown 3 -}}
{{- if $drains -}}
{{- $need = addf $need $drain -}}
{{- end -}}
{{- dict "drainDelay" $drain "drains" $drains "shutdown" $shutdown "preStop" $preStop "need" $need | toJson -}}
{{- end -}}

{{/* Grace period and readiness probe that do not fit the shutdown: fail with the fix. */}}
{{- define "kvroute.validateShutdown" -}}
{{- $s := include "kvroute.shutdown" . | fromJson -}}
{{- $grace := .Values.terminationGracePeriodSeconds -}}
{{- if not (regexMatch "^[0-9]+$" (toString $grace)) -}}
{{- fail (printf "terminationGracePeriodSeconds: %q: give whole seconds" (toString $grace)) -}}
{{- end -}}
{{- if lt (float64 $grace) $s.need -}}
{{- fail (printf "terminationGracePeriodSeconds: %v is shorter than a pod's shutdown: preStop sleep %v s + config.server.drain_delay %v s (%s) + config.server.shutdown_timeout %v s + 3 s (the cut requests' last second, the admin server's, the exit) = %v s: raise it to %v, or shorten those (requests still in flight when Kubernetes kills the pod are cut without a word)" (toString $grace) $s.preStop (ternary $s.drainDelay 0 $s.drains) (ternary "waited out" "skipped: no readiness probe asks /readyz, or the delay is 0" $s.drains) $s.shutdown $s.need (ceil $s.need)) -}}
{{- end -}}
{{- if $s.drains -}}
{{- $probe := .Values.readinessProbe -}}
{{- $period := int (dig "periodSeconds" 10 $probe) -}}
{{- $failures := int (dig "failureThreshold" 3 $probe) -}}
{{- $took := mul $period $failures -}}
{{- if gt (float64 (add $took 1)) $s.drainDelay -}}
{{- $fix := printf "raise config.server.drain_delay to %ds" (add $took 1) -}}
{{- if ge $s.drainDelay 2.0 -}}
{{- $fix = printf "make periodSeconds x failureThreshold at most %v, or %s" (floor (subf $s.drainDelay 1)) $fix -}}
{{- end -}}
{{- fail (printf "readinessProbe: periodSeconds %d x failureThreshold %d: the probe may take %d s to see /readyz fail at SIGTERM, and the pod's endpoints a second to follow, longer than config.server.drain_delay (%v s), after which kvroute closes its API listener: %s" $period $failures $took $s.drainDelay $fix) -}}
{{- end -}}
{{- end -}}
{{- end -}}
