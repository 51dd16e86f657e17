# kvroute: build, test, benchmark.
GO      ?= go
PKGS    := ./...
FUZZTIME ?= 3s

.PHONY: all build test unit fuzz bench bench-smoke vet fmt demo ci realengine

all: build

build:
	$(GO) build -o bin/kvroute ./cmd/kvroute

# The full test suite, as CI runs it: vet, unit and e2e tests with -race, each fuzz target for
# a few seconds, every benchmark once.
test: vet unit fuzz bench-smoke

# The real-engine suite: kvroute in front of three ollama instances (built from source by
# scripts/ollama.sh once, then cached; needs the Debian packages nlohmann-json3-dev and
# libstb-dev, which .ci/run installs). About 11 minutes the first time, 3 after.
realengine:
	KVROUTE_OLLAMA="$$(GO=$(GO) bash scripts/ollama.sh)" && export KVROUTE_OLLAMA && \
		$(GO) test -race -count=1 -timeout 20m -v -run 'TestRealEngine' ./test/realengine/

unit:
	$(GO) test -race -count=1 -timeout 10m $(PKGS)

# Each fuzz target for $(FUZZTIME); scripts/fuzz.sh says why a bare deadline report is retried.
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

bench-smoke:
	$(GO) test -run '^$$' -bench . -benchtime=1x -benchmem $(PKGS)

vet:
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1)

fmt:
	gofmt -w $$(git ls-files '*.go')

demo:
	$(GO) run ./cmd/kvroute demo
