{{/* Endpoint-picker mode: kvroute as the ext_proc endpoint picker of an InferencePool. */}}

{{/* The InferencePool's name: inferencePool.name, or the release's full name. */}}
{{- define "kvroute.poolName" -}}
{{- default (include "kvroute.fullname" .) .Values.endpointPicker.inferencePool.name -}}
{{- end -}}

{{- define "kvroute.validatePicker" -}}
{{- $ext := .Values.config.extproc | default dict -}}
{{- range $k := list "listen" "health_listen" -}}
{{- if hasKey $ext $k -}}
{{- fail (printf "config.extproc.%s: leave it out: the chart sets it from endpointPicker.port and endpointPicker.healthPort (mode: endpointPicker)" $k) -}}
{{- end -}}
{{- end -}}
{{- if and (hasKey .Values.config "discovery") (hasKey (.Values.config.discovery | default dict) "inference_pool") -}}
{{- fail "config.discovery.inference_pool: leave it out: use mode: endpointPicker and endpointPicker.inferencePool (the chart renders the RBAC for it)" -}}
{{- end -}}
{{- if eq .Values.mode "endpointPicker" -}}
{{- $ep := .Values.endpointPicker -}}
{{- if and $ep.tls.selfSigned (hasKey $ext "tls") -}}
{{- fail "config.extproc.tls: leave it out with endpointPicker.tls.selfSigned: true, or set selfSigned: false to give your own certificate files" -}}
{{- end -}}
{{- $pool := $ep.inferencePool -}}
{{- if and $pool.create (not $pool.selector) -}}
{{- fail "endpointPicker.inferencePool.selector: give the model server pods' labels (app: vllm-llama3-8b), or set create: false and create the InferencePool yourself" -}}
{{- end -}}
{{- if and $pool.create (not (has $pool.failureMode (list "FailOpen" "FailClose"))) -}}
{{- fail (printf "endpointPicker.inferencePool.failureMode: %q: use FailClose or FailOpen" $pool.failureMode) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Sets extproc and discovery.inference_pool in the config (list . $cfg) in endpoint-picker mode. */}}
{{- define "kvroute.pickerConfig" -}}
{{- $ := index . 0 -}}
{{- $cfg := index . 1 -}}
{{- if eq $.Values.mode "endpointPicker" -}}
{{- $ep := $.Values.endpointPicker -}}
{{- $ext := deepCopy ($cfg.extproc | default dict) -}}
{{- $_ := set $ext "listen" (printf "0.0.0.0:%v" $ep.port) -}}
{{- $_ := set $ext "health_listen" (printf "0.0.0.0:%v" $ep.healthPort) -}}
{{- if $ep.tls.selfSigned -}}
{{- $_ := set $ext "tls" (dict "self_signed" true) -}}
{{- end -}}
{{- $_ := set $cfg "extproc" $ext -}}
{{- $pool := $ep.inferencePool -}}
{{- $d := deepCopy ($cfg.discovery | default dict) -}}
{{- $ip := dict "name" (include "kvroute.poolName" $) "namespace" $.Release.Namespace "scheme" $pool.scheme "endpoint" $pool.endpoint -}}
{{- with $pool.grace -}}
{{- $_ := set $ip "grace" . -}}
{{- end -}}
{{- $_ := set $d "inference_pool" $ip -}}
{{- $_ := set $cfg "discovery" $d -}}
{{- end -}}
{{- end -}}
