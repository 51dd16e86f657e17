{{/* Router replicas that share what they learn (the config's peers section). */}}

{{/* The headless Service the replicas find each other by. */}}
{{- define "kvroute.peersService" -}}
{{- printf "%s-peers" (include "kvroute.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Secret holding the peers' shared secret: existingSecret or the chart's. */}}
{{- define "kvroute.peersSecret" -}}
{{- default (printf "%s-peers" (include "kvroute.fullname" .)) .Values.peers.secret.existingSecret -}}
{{- end -}}

{{- define "kvroute.validatePeers" -}}
{{- if hasKey .Values.config "peers" -}}
{{- range $k := list "listen" "gossip_listen" "static" "dns" "kubernetes" "secret_file" "secret_env" "accept_secret_file" "accept_secret_env" "tls" -}}
{{- if hasKey ($.Values.config.peers | default dict) $k -}}
{{- fail (printf "config.peers.%s: leave it out: the chart sets it (peers.enabled, peers.port, peers.gossipPort, peers.discovery, peers.secret, peers.tls)" $k) -}}
{{- end -}}
{{- end -}}
{{- if not .Values.peers.enabled -}}
{{- fail "config.peers: set peers.enabled: true as well (the chart renders the peers' Service, ports and secret)" -}}
{{- end -}}
{{- if .Values.peers.advertisePodIP -}}
{{- range $k := list "advertise" "advertise_env" -}}
{{- if hasKey ($.Values.config.peers | default dict) $k -}}
{{- fail (printf "config.peers.%s: leave it out: the chart sets advertise_env to the pod IP (peers.advertisePodIP); set peers.advertisePodIP: false to give your own" $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if .Values.peers.enabled -}}
{{- $s := .Values.peers.secret -}}
{{- if and (not .Values.autoscaling.enabled) (lt (int .Values.replicaCount) 2) -}}
{{- fail "peers.enabled: a lone replica has no peers: set replicaCount to 2 or more (or autoscaling.enabled), or peers.enabled: false" -}}
{{- end -}}
{{- if and $s.value $s.existingSecret -}}
{{- fail "peers.secret: give value or existingSecret, not both" -}}
{{- end -}}
{{- if and $s.acceptKey (not $s.existingSecret) -}}
{{- fail "peers.secret.acceptKey: a key of existingSecret: rotate the secret in a Secret you manage (docs/replicas.md, \"Rotating the secret\")" -}}
{{- end -}}
{{- if and $s.acceptKey (eq $s.acceptKey $s.key) -}}
{{- fail "peers.secret.acceptKey: the same as peers.secret.key: name the second secret's own key" -}}
{{- end -}}
{{- if and $s.value (lt (len $s.value) 32) -}}
{{- fail "peers.secret.value: at least 32 bytes (the replicas sign and encrypt with keys derived from it): make one with head -c 32 /dev/urandom | base64, or leave it empty for the chart to generate one" -}}
{{- end -}}
{{- if not (has .Values.peers.discovery (list "dns" "kubernetes")) -}}
{{- fail (printf "peers.discovery: %q: use dns (the headless Service's name) or kubernetes (its EndpointSlices, through the API)" .Values.peers.discovery) -}}
{{- end -}}
{{- if eq (int .Values.peers.port) (int .Values.peers.gossipPort) -}}
{{- fail "peers.gossipPort: the same as peers.port: give membership its own port (7946)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when the replicas find each other through the Kubernetes API. */}}
{{- define "kvroute.peersKube" -}}
{{- if and .Values.peers.enabled (eq .Values.peers.discovery "kubernetes") -}}true{{- end -}}
{{- end -}}

{{/* The environment variable holding the pod IP that each replica advertises (the config's
peers.advertise_env), set from the downward API; empty when the chart sets none. */}}
{{- define "kvroute.peersPodIPEnv" -}}
{{- if and .Values.peers.enabled .Values.peers.advertisePodIP -}}KVROUTE_POD_IP{{- end -}}
{{- end -}}

{{/* Sets peers in the config (list . $cfg) when peers.enabled. */}}
{{- define "kvroute.peersConfig" -}}
{{- $ := index . 0 -}}
{{- $cfg := index . 1 -}}
{{- if $.Values.peers.enabled -}}
{{- $p := deepCopy ($cfg.peers | default dict) -}}
{{- $_ := set $p "listen" (printf "0.0.0.0:%v" $.Values.peers.port) -}}
{{- $_ := set $p "gossip_listen" (printf "0.0.0.0:%v" $.Values.peers.gossipPort) -}}
{{- if eq $.Values.peers.discovery "kubernetes" -}}
{{- $_ := set $p "kubernetes" (dict "service" (include "kvroute.peersService" $) "namespace" $.Release.Namespace "port_name" "gossip") -}}
{{- else -}}
{{- $name := printf "%s.%s.svc.%s" (include "kvroute.peersService" $) $.Release.Namespace $.Values.peers.clusterDomain -}}
{{- $_ := set $p "dns" (dict "name" $name "port" (int $.Values.peers.gossipPort)) -}}
{{- end -}}
{{- with include "kvroute.peersPodIPEnv" $ -}}
{{- $_ := set $p "advertise_env" . -}}
{{- end -}}
{{- $_ := set $p "secret_file" (printf "/etc/kvroute-peers/%s" $.Values.peers.secret.key) -}}
{{- if $.Values.peers.secret.acceptKey -}}
{{- $_ := set $p "accept_secret_file" (printf "/etc/kvroute-peers/%s" $.Values.peers.secret.acceptKey) -}}
{{- end -}}
{{- if $.Values.peers.tls.secretName -}}
{{- $d := "/etc/kvroute-peers-tls" -}}
{{- $_ := set $p "tls" (dict "cert_file" (printf "%s/tls.crt" $d) "key_file" (printf "%s/tls.key" $d) "ca_file" (printf "%s/ca.crt" $d) "server_name" (default (include "kvroute.peersService" $) $.Values.peers.tls.serverName)) -}}
{{- end -}}
{{- $_ := set $cfg "peers" $p -}}
{{- end -}}
{{- end -}}
