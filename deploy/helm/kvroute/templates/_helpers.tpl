{{/* The release's name for every object, at most 63 characters. */}}
{{- define "kvroute.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kvroute.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvroute.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvroute.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kvroute.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: router
{{- end -}}

{{- define "kvroute.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvroute.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kvroute.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Values the chart cannot render: fail with the fix. */}}
{{- define "kvroute.validate" -}}
{{- if not (has .Values.mode (list "standalone" "endpointPicker")) -}}
{{- fail (printf "mode: %q is not a mode: use standalone or endpointPicker" .Values.mode) -}}
{{- end -}}
{{- include "kvroute.validatePicker" . -}}
{{- include "kvroute.validatePeers" . -}}
{{- include "kvroute.validateShutdown" . -}}
{{- range $k := list "listen" "admin_listen" -}}
{{- if hasKey $.Values.config $k -}}
{{- fail (printf "config.%s: leave it out: the chart sets it from service.api.port and service.admin.port" $k) -}}
{{- end -}}
{{- end -}}
{{- if and (hasKey .Values.config "discovery") (hasKey (.Values.config.discovery | default dict) "kubernetes") -}}
{{- fail "config.discovery.kubernetes: leave it out: use kubernetesDiscovery.watches (the chart renders the RBAC for it)" -}}
{{- end -}}
{{- if and .Values.saltSecret.value .Values.saltSecret.existingSecret -}}
{{- fail "saltSecret: give value or existingSecret, not both" -}}
{{- end -}}
{{- if and .Values.saltSecret.value (lt (len .Values.saltSecret.value) 32) -}}
{{- fail "saltSecret.value: at least 32 bytes (kvroute derives the tenants' cache salts from it): make one with head -c 32 /dev/urandom | base64" -}}
{{- end -}}
{{- if and (hasKey .Values.config "autoscale") (hasKey (.Values.config.autoscale | default dict) "pod_deletion_cost") -}}
{{- fail "config.autoscale.pod_deletion_cost: leave it out: use podDeletionCost (the chart renders the RBAC for it)" -}}
{{- end -}}
{{- if and .Values.podDeletionCost.enabled (not (include "kvroute.kubeDiscovery" .)) -}}
{{- fail "podDeletionCost.enabled: needs kubernetesDiscovery.enabled: the pods it writes are the ones discovery finds" -}}
{{- end -}}
{{- if and (include "kvroute.kubeDiscovery" .) (not .Values.kubernetesDiscovery.watches) -}}
{{- fail "kubernetesDiscovery.watches: list at least one watch (service: vllm, port_name: http), or set enabled: false" -}}
{{- end -}}
{{- if include "kvroute.kubeDiscovery" . -}}
{{- range $i, $w := .Values.kubernetesDiscovery.watches -}}
{{- if not (dig "endpoint" "engine" "" ($w | default dict)) -}}
{{- fail (printf "kubernetesDiscovery.watches[%d].endpoint.engine: give the engines' kind (vllm, sglang, tgi, llamacpp, ollama, openai or auto): without it kvroute would take them for openai (no metrics scraped, no cache_salt). --set on watches[%d] replaces the whole list, the default watch's engine: vllm included" $i $i) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The kvroute config file: config plus what the chart owns. */}}
{{- define "kvroute.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $_ := set $cfg "listen" (printf "0.0.0.0:%v" .Values.service.api.port) -}}
{{- $_ := set $cfg "admin_listen" (printf "0.0.0.0:%v" .Values.service.admin.port) -}}
{{- if include "kvroute.kubeDiscovery" . -}}
{{- $d := deepCopy (.Values.config.discovery | default dict) -}}
{{- $_ := set $d "kubernetes" .Values.kubernetesDiscovery.watches -}}
{{- $_ := set $cfg "discovery" $d -}}
{{- end -}}
{{- if .Values.podDeletionCost.enabled -}}
{{- $a := deepCopy ($cfg.autoscale | default dict) -}}
{{- $p := .Values.podDeletionCost -}}
{{- $_ := set $a "pod_deletion_cost" (dict "enabled" true "interval" $p.interval "min_change" $p.minChange "patches_per_second" $p.patchesPerSecond) -}}
{{- $_ := set $cfg "autoscale" $a -}}
{{- end -}}
{{- include "kvroute.pickerConfig" (list . $cfg) -}}
{{- include "kvroute.peersConfig" (list . $cfg) -}}
{{- if or .Values.saltSecret.value .Values.saltSecret.existingSecret -}}
{{- $auth := deepCopy ($cfg.auth | default dict) -}}
{{- $_ := set $auth "secret_file" (printf "/etc/kvroute-secret/%s" .Values.saltSecret.key) -}}
{{- $_ := set $cfg "auth" $auth -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* "true" when discovery.kubernetes is rendered: standalone mode only (in endpoint-picker
mode the InferencePool names the engines). */}}
{{- define "kvroute.kubeDiscovery" -}}
{{- if and (eq .Values.mode "standalone") .Values.kubernetesDiscovery.enabled -}}true{{- end -}}
{{- end -}}

{{/* Whether the pods need a service account token: they read the Kubernetes API. */}}
{{- define "kvroute.apiAccess" -}}
{{- if or (include "kvroute.kubeDiscovery" .) (eq .Values.mode "endpointPicker") (include "kvroute.peersKube" .) -}}true{{- else -}}false{{- end -}}
{{- end -}}

{{/* The namespaces the discovery watches, for RBAC. */}}
{{- define "kvroute.watchNamespaces" -}}
{{- $out := list -}}
{{- range .Values.kubernetesDiscovery.watches -}}
{{- $out = append $out (default $.Release.Namespace .namespace) -}}
{{- end -}}
{{- $out | uniq | toJson -}}
{{- end -}}

{{/* GOMEMLIMIT for the container: memoryLimitPercent of resources.limits.memory, in MiB, when
that limit is written in Gi, Mi or Ki (whole numbers); "" otherwise (no limit set, or another
unit: then none is set). */}}
{{- define "kvroute.goMemLimit" -}}
{{- $m := toString (dig "limits" "memory" "" (.Values.resources | default dict)) -}}
{{- $pct := int .Values.memoryLimitPercent -}}
{{- if and (gt $pct 0) (regexMatch "^[0-9]+(Gi|Mi|Ki)$" $m) -}}
{{- $n := int (regexFind "^[0-9]+" $m) -}}
{{- $kib := $n -}}
{{- if hasSuffix "Gi" $m }}{{ $kib = mul $n 1048576 }}{{ else if hasSuffix "Mi" $m }}{{ $kib = mul $n 1024 }}{{ end -}}
{{- $mib := div (mul $kib $pct) 102400 -}}
{{- if gt $mib 0 }}{{ $mib }}MiB{{ end -}}
{{- end -}}
{{- end -}}
