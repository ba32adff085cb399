# verdict — a policy decision service. `make help` lists the targets.
SHELL := /bin/bash
GO    ?= go
SHARED_SUITES := $(wildcard ../shared/conformance/*.yaml)
FUZZTIME ?= 10s
# Pinned tools (tools/*/go.mod): buf and grpcurl, the protoc plugins, golangci-lint.
BUF := $(GO) tool -modfile=tools/buf/go.mod buf
GOLANGCI := $(GO) tool -modfile=tools/golangci/go.mod golangci-lint
RUN_FLAGS ?=

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: run
run: ## build bin/verdictd (listing what it compiles), run it on an embedded etcd (.data/) with examples/policies.yaml
	@echo "make run: building bin/verdictd; go build -v names each package it compiles (none when cached)"
	$(GO) build -v -o bin/verdictd ./cmd/verdictd
	exec bin/verdictd --data-dir .data/etcd --bootstrap examples/policies.yaml $(RUN_FLAGS)

.PHONY: build
build: ## build bin/verdictd, bin/verdictctl, bin/verdict-agent, bin/verdict-loadtest and the pinned grpcurl into bin/
	$(GO) build -o bin/ ./cmd/verdictd ./cmd/verdictctl ./cmd/verdict-agent ./cmd/verdict-loadtest
	$(GO) build -modfile=tools/buf/go.mod -o bin/ github.com/fullstorydev/grpcurl/cmd/grpcurl

.PHONY: test
test: ## unit, integration, end-to-end and conformance tests, brief fuzzing (what CI runs)
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 20m ./...
	$(GO) run ./cmd/verdictctl test testdata/conformance/*.yaml $(wildcard testdata/*.yaml)
	$(GO) run ./cmd/verdictctl fmt --check examples/
ifneq ($(SHARED_SUITES),)
	$(GO) run ./cmd/verdictctl test $(SHARED_SUITES)
endif
	$(MAKE) fuzz FUZZTIME=$(FUZZTIME)

.PHONY: fuzz
fuzz: ## run every fuzz target for FUZZTIME each (default 10s)
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz' || true); do \
	    echo "fuzz $$pkg $$f"; \
	    log=$$(mktemp); \
	    for try in 1 2 3; do \
	      if $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg >$$log 2>&1; then break; fi; \
	      if [ $$try -lt 3 ] && grep -q 'context deadline exceeded' $$log && ! grep -q 'Failing input written' $$log; then \
	        echo "  no crasher: go1.26's fuzz coordinator races -fuzztime (golang/go#75804, fixed in go1.27); again"; continue; \
	      fi; \
	      cat $$log; rm -f $$log; exit 1; \
	    done; \
	    rm -f $$log; \
	  done; \
	done

CHAOS_FLAGS ?=
HOSTILE_FLAGS ?=
SOAK ?= 10m
SOAK_FLAGS ?=

.PHONY: chaos
chaos: ## faults with real processes (3-member etcd, 2 verdictd, steady load), then hostile clients: prints the figures (CHAOS_FLAGS=--json ...)
	$(GO) build -o bin/ ./cmd/verdictd ./cmd/verdict-chaos
	bin/verdict-chaos --verdictd bin/verdictd $(CHAOS_FLAGS); a=$$?; \
	  bin/verdict-chaos hostile --verdictd bin/verdictd $(HOSTILE_FLAGS); b=$$?; \
	  exit $$(( a > b ? a : b ))

.PHONY: soak
soak: ## SOAK (default 10m) of mixed load: goroutines and heap of each verdictd every minute, and their growth
	$(GO) build -o bin/ ./cmd/verdictd ./cmd/verdict-chaos
	bin/verdict-chaos soak --verdictd bin/verdictd --duration $(SOAK) $(SOAK_FLAGS)

.PHONY: bench
bench: ## engine benchmarks (Decide, build, change, memory), the server vs an empty handler, the flow decoder, the rules hub, and the peers (OPA, cedar-go, scan)
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./engine/...
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./server/ ./internal/flowcodec/ ./internal/fanout/
	cd loadtest/peers && $(GO) run ./cmd/compare -sizes 1000,10000,100000 -flows 4096

.PHONY: loadtest
loadtest: ## every load-test scenario against a fresh verdictd with 10k policies, about a minute
	$(GO) build -o bin/ ./cmd/verdictd ./cmd/verdict-loadtest
	bin/verdict-loadtest --policies 10000 --duration 3s --warmup 1s $(LOADTEST_FLAGS)

ROUNDS ?= 8
AB_FLAGS ?=

.PHONY: ab
ab: ## same-run A/B of make bench and make loadtest, this tree against BASE=<git rev>, ROUNDS alternated rounds (AB_FLAGS=...)
	@test -n "$(BASE)" || { echo "make ab: name the base revision: make ab BASE=<rev> [ROUNDS=8]"; exit 2; }
	$(GO) build -o bin/ ./cmd/verdict-loadtest
	bin/verdict-loadtest ab --base $(BASE) --rounds $(ROUNDS) $(AB_FLAGS)

.PHONY: proto
proto: ## format, lint and generate the protos (generated Go is checked in beside them)
	$(BUF) format -w
	$(BUF) lint
	$(BUF) generate

.PHONY: lint
lint: ## go vet, gofmt, golangci-lint (depguard keeps the engine free of gRPC and etcd), buf lint and format, generated code current
	$(GO) vet ./...
	$(GOLANGCI) run ./...
	@test -z "$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go'))" || { gofmt -l $$(git ls-files -co --exclude-standard '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(BUF) lint
	$(BUF) format -d --exit-code
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	  $(BUF) generate -o $$tmp && \
	  diff -r --exclude='*.proto' --exclude=doc.go $$tmp/proto proto >/dev/null || { echo "generated code is stale: run make proto"; diff -r --exclude='*.proto' --exclude=doc.go $$tmp/proto proto | head -20; exit 1; }
