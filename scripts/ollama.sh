#!/usr/bin/env bash
# scripts/ollama.sh: build ollama (a real inference engine with a real KV cache, CPU only) from its
# Go module for the real-engine suite (test/realengine), or reuse the binary built before with the
# same version and flags. Prints the binary's path on stdout; progress goes to stderr.
#
#   KVROUTE_OLLAMA=$(bash scripts/ollama.sh) go test -count=1 ./test/realengine/
#
# Why it is built this way:
# - `go install github.com/ollama/ollama@VERSION` compiles llama.cpp's CPU backend through cgo (no
#   cmake). Module zips drop every vendor/ folder, so three vendored headers are missing: Debian's
#   nlohmann-json3-dev and libstb-dev provide two (.ci/run installs them), and miniaudio.h comes
#   from the Go module github.com/gen2brain/malgo, added with CGO_CPPFLAGS.
# - Explicit -mavx2 -mfma -mf16c, not -march=native: the binary is cached and may be restored on
#   another machine of the same family; native could pick instructions that machine lacks.
# - The cache key is the version, the flags and the malgo version, hashed into the folder name:
#   change any of them and the next run builds afresh, next to the old binary.
#
# Environment: OLLAMA_VERSION (v0.17.4), OLLAMA_BUILD_TIMEOUT (seconds, 2400),
# XDG_CACHE_HOME (~/.cache). Exit status 0 with the path printed, non-zero with the reason.
set -euo pipefail

version=${OLLAMA_VERSION:-v0.17.4}
malgo=v0.11.24
cflags="-O3 -mavx2 -mfma -mf16c"
timeout_s=${OLLAMA_BUILD_TIMEOUT:-2400}
go=${GO:-go}

key=$(printf '%s\n' "$version" "$cflags" "malgo@$malgo" | sha256sum | cut -c1-12)
dir=${XDG_CACHE_HOME:-$HOME/.cache}/kvroute/ollama-$version-$key
bin=$dir/ollama

say() { echo "ollama.sh: $*" >&2; }

if [ -x "$bin" ]; then
	say "cached: $bin"
	echo "$bin"
	exit 0
fi

for h in /usr/include/nlohmann/json.hpp /usr/include/stb/stb_image.h; do
	if [ ! -f "$h" ]; then
		say "missing $h: apt-get install nlohmann-json3-dev libstb-dev (.ci/run does)"
		exit 2
	fi
done
if ! grep -qw avx2 /proc/cpuinfo 2>/dev/null || ! grep -qw f16c /proc/cpuinfo 2>/dev/null; then
	say "this CPU lacks AVX2 or F16C, which the build flags ($cflags) require"
	exit 2
fi

mkdir -p "$dir"
# One build at a time per cache folder: a second caller waits for the first, then finds the
# binary. The lock is released when this shell exits.
exec 9>"$dir/.lock"
if ! flock -w "$timeout_s" 9; then
	say "timed out after ${timeout_s}s waiting for another build in $dir"
	exit 3
fi
if [ -x "$bin" ]; then
	say "built meanwhile: $bin"
	echo "$bin"
	exit 0
fi

work=$(mktemp -d "$dir/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/empty" "$work/inc/miniaudio" "$work/bin"

# The malgo module is only a source of one header: download it, do not build it.
malgo_dir=$(cd "$work/empty" && timeout 600 "$go" mod download -json "github.com/gen2brain/malgo@$malgo" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
if [ ! -f "$malgo_dir/miniaudio.h" ]; then
	say "github.com/gen2brain/malgo@$malgo has no miniaudio.h (looked in '$malgo_dir')"
	exit 4
fi
cp "$malgo_dir/miniaudio.h" "$work/inc/miniaudio/"

say "building ollama $version (cgo, CPU backend, $cflags; ~10 min on 2 cores with a cold module cache)"
start=$SECONDS
# Run outside any module (an empty folder) so this repository's go.mod plays no part.
if ! (cd "$work/empty" && GOBIN="$work/bin" GOFLAGS=-buildvcs=false GOTOOLCHAIN=local CGO_ENABLED=1 \
	CGO_CPPFLAGS="-I$work/inc" CGO_CFLAGS="$cflags" CGO_CXXFLAGS="$cflags" \
	timeout "$timeout_s" "$go" install "github.com/ollama/ollama@$version") >&2; then
	say "build failed or ran past ${timeout_s}s"
	exit 5
fi
mv "$work/bin/ollama" "$bin"
say "built in $((SECONDS - start)) s: $bin"
echo "$bin"
