# verdict — a policy decision service. `make help` lists the targets.
SHELL := /bin/bash
GO    ?= go
SHARED_SUITES := $(wildcard ../shared/conformance/*.yaml)
FUZZTIME ?= 10s

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: test
test: ## unit, integration and conformance tests, brief fuzzing (what CI runs)
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...
	$(GO) run ./cmd/verdictctl test testdata/conformance/*.yaml $(wildcard testdata/*.yaml)
ifneq ($(SHARED_SUITES),)
	$(GO) run ./cmd/verdictctl test $(SHARED_SUITES)
endif
	$(MAKE) fuzz FUZZTIME=$(FUZZTIME)

.PHONY: fuzz
fuzz: ## run every fuzz target for FUZZTIME each (default 10s)
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz' || true); do \
	    echo "fuzz $$pkg $$f"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg >/dev/null || { $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime 1x $$pkg; exit 1; }; \
	  done; \
	done

.PHONY: bench
bench: ## engine benchmarks (Decide, build, change, memory)
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./engine/...

.PHONY: lint
lint: ## go vet, gofmt
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
