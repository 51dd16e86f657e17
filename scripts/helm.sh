#!/usr/bin/env bash
# Builds the helm CLI from its Go module (no download site needed: the Go module proxy serves
# helm.sh/helm/v3) into a cache keyed on its version, and prints the binary's path. CI exports
# it as KVROUTE_HELM for deploy/helm's test, which runs helm lint and helm template on the
# chart. A cold build takes about two minutes on 2 cores; later runs reuse the binary.
#
#   KVROUTE_HELM=$(bash scripts/helm.sh) go test ./deploy/helm/
set -euo pipefail
HELM_VERSION=${HELM_VERSION:-v3.21.4}
GO=${GO:-go}
dir="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute/helm-${HELM_VERSION}"
if [ ! -x "$dir/helm" ]; then
  mkdir -p "$dir"
  # Outside the module, so that helm's dependencies never touch kvroute's go.mod.
  (cd "$dir" && GOBIN="$dir" timeout 900 "$GO" install "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}") >&2
fi
"$dir/helm" version --short >&2
echo "$dir/helm"
