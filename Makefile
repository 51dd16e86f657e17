# kvroute: build, test, benchmark.
GO      ?= go
PKGS    := ./...
FUZZTIME ?= 3s

.PHONY: all build image helm test unit fuzz bench bench-smoke vet fmt demo ci realengine

# What `kvroute version` and the image labels say. GOFLAGS may hold -buildvcs=false (the Go
# command then records no revision), so the build stamps it with -ldflags -X.
VERSION  ?= $(shell git describe --tags --match 'v*' --always --dirty 2>/dev/null || echo unknown)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
MODIFIED ?= $(shell test -z "$$(git status --porcelain --untracked-files=no 2>/dev/null)" && echo false || echo true)
VPKG     := github.com/kvroute/kvroute/internal/version
LDFLAGS  := -X $(VPKG).version=$(VERSION) -X $(VPKG).revision=$(REVISION) -X $(VPKG).modified=$(MODIFIED)

# The image (docs/kubernetes.md: tags and labels): a static binary for linux/$(ARCH), written as
# an OCI layout ($(IMAGE_DIR)/oci) and a docker-load tarball ($(IMAGE_DIR)/kvroute-image.tar),
# built in Go (tools/image), no container engine needed; loaded into Docker when an engine runs.
IMAGE     ?= kvroute/kvroute
ARCH      ?= $(shell $(GO) env GOARCH)
IMAGE_DIR ?= bin/image
IMAGE_TAG ?= $(subst +,-,$(VERSION))

# npm installs the official openai client that the end-to-end tests drive. Without npm those
# tests skip; `make test NPM=` skips the install where npm is present but cannot be used.
NPM        ?= $(shell command -v npm 2>/dev/null)
E2E_CLIENT := test/e2e/node_modules/.package-lock.json

all: build

# helm lint and helm template on deploy/helm/kvroute, manifests decoded strictly (the helm CLI is
# built from its Go module the first time: scripts/helm.sh).
helm:
	KVROUTE_HELM="$$(bash scripts/helm.sh)" $(GO) test -count=1 ./deploy/helm/

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/kvroute ./cmd/kvroute

image:
	CGO_ENABLED=0 GOOS=linux GOARCH=$(ARCH) $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' -o $(IMAGE_DIR)/linux-$(ARCH)/kvroute ./cmd/kvroute
	$(GO) run ./tools/image --binary $(IMAGE_DIR)/linux-$(ARCH)/kvroute --arch $(ARCH) \
		--version $(VERSION) --revision $(REVISION) \
		--tag $(IMAGE):$(IMAGE_TAG),$(IMAGE):sha-$(shell echo $(REVISION) | cut -c1-12) \
		--layout $(IMAGE_DIR)/oci --tar $(IMAGE_DIR)/kvroute-image.tar
	@if docker info >/dev/null 2>&1; then docker load -i $(IMAGE_DIR)/kvroute-image.tar; \
	else echo "no Docker engine: load $(IMAGE_DIR)/kvroute-image.tar with docker load, or push $(IMAGE_DIR)/oci"; fi

# The full test suite, as CI runs it: vet, unit and e2e tests with -race, each fuzz target for
# a few seconds, every benchmark once.
test: vet unit fuzz bench-smoke

# The real-engine suite: kvroute in front of three ollama instances (built from source by
# scripts/ollama.sh once, then cached; needs the Debian packages nlohmann-json3-dev and
# libstb-dev, which .ci/run installs). About 11 minutes the first time, 3 after.
realengine:
	KVROUTE_OLLAMA="$$(GO=$(GO) bash scripts/ollama.sh)" && export KVROUTE_OLLAMA && \
		$(GO) test -race -count=1 -timeout 20m -v -run 'TestRealEngine' ./test/realengine/

unit: $(if $(NPM),$(E2E_CLIENT))
	$(GO) test -race -count=1 -timeout 10m $(PKGS)
	# h1's raw connections make their system calls through package syscall under -race
	# (internal/h1/rawsys_race.go): their tests once more without it, on the raw calls.
	$(GO) test -count=1 -run 'RawConn|RawSyscalls|Wrap|ConnectionsAreRaw|BodyReadWaits' ./internal/h1/

# npm ci when node_modules is missing or older than the lock file; npm writes the hidden lock
# file $(E2E_CLIENT) on every install (touched in case an old npm does not).
$(E2E_CLIENT): test/e2e/package.json test/e2e/package-lock.json
	@echo "npm ci in test/e2e (the openai client of the end-to-end tests)"
	@cd test/e2e && $(NPM) ci --no-audit --no-fund --loglevel=error >/dev/null || \
	  { echo "npm ci failed in test/e2e: fix it, or run make test NPM= to skip the openai client tests"; exit 1; }
	@touch $@

# Each fuzz target for $(FUZZTIME); scripts/fuzz.sh says why a bare deadline report is retried.
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

bench-smoke:
	$(GO) test -run '^$$' -bench . -benchtime=1x -benchmem $(PKGS)

# go vet, then staticcheck (run at its pinned version from the module proxy; nothing in go.mod).
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
vet:
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1)

fmt:
	gofmt -w $$(git ls-files '*.go')

demo:
	$(GO) run ./cmd/kvroute demo
