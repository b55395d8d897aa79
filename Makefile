# Spillway: a Kubernetes operator for transactional-outbox drainer fleets.

GO          ?= go
BIN         := $(CURDIR)/bin
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X main.version=$(VERSION)
# Each package's suite uses its own tables and exchanges, so packages run in
# parallel against the one Postgres and the one RabbitMQ.
TEST_FLAGS  ?= -v -count=1 -timeout 20m

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*##/ {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/spillway.
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/spillway .

.PHONY: services
services: ## Start the local Postgres and RabbitMQ if they are installed but stopped.
	@hack/services.sh

# The fault suite stops RabbitMQ, raises its memory alarm and kills Postgres
# sessions, so it runs alone, after the others.
FAULTS      := ./test/faults

.PHONY: test
test: services ## Run every test suite against the local Postgres and RabbitMQ, the fault suite last.
	$(GO) vet ./...
	$(GO) test $(TEST_FLAGS) $$($(GO) list ./... | grep -v '/test/faults$$')
	$(GO) test $(TEST_FLAGS) $(FAULTS)

.PHONY: bench
bench: services ## Measure broker ceiling, drainer throughput, claim latency and commit→publish latency; prints ratios.
	$(GO) run ./test/bench

STATICCHECK_VERSION ?= v0.8.2

.PHONY: lint
lint: ## gofmt, go vet and staticcheck.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
