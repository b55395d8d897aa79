# Spillway: a Kubernetes operator for transactional-outbox drainer fleets.

GO          ?= go
BIN         := $(CURDIR)/bin
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X main.version=$(VERSION)
# Each package's suite uses its own tables and exchanges, so packages run in
# parallel against the one Postgres and the one RabbitMQ.
TEST_FLAGS  ?= -v -count=1 -timeout 20m

# Tools, built into bin/ at pinned versions. Defined before the rules that
# name them as prerequisites, which make expands as it reads them.
CONTROLLER_GEN_VERSION ?= v0.23.0
CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_GEN_VERSION)
HELM_VERSION ?= v3.22.0
HELM := $(BIN)/helm-$(HELM_VERSION)
CRD_REF_DOCS_VERSION ?= v0.3.0
CRD_REF_DOCS := $(BIN)/crd-ref-docs-$(CRD_REF_DOCS_VERSION)

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*##/ {printf "  %-17s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/spillway.
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/spillway .

.PHONY: services
services: ## Start the local Postgres and RabbitMQ if they are installed but stopped.
	@hack/services.sh

# The fault suites stop RabbitMQ, raise its memory alarm, kill Postgres
# sessions and fail over a primary of their own (hack/postgres-ha.sh), so
# they run alone, after the others. The lock extends that to
# other runs on the same machine (a second checkout, make bench): they share
# the services, and a fault run takes them for itself. -o keeps the lock from
# the daemons a fault spec restarts, which would otherwise hold it for good.
FAULTS        := ./test/faults ./test/brokerfaults ./test/dbfaults
SERVICES_LOCK ?= /tmp/spillway-services.lock

# SUITE_ENV builds (once) and points the suites at the control plane, helm
# and promtool; a recipe line continues it with && and the tests.
SUITE_ENV = assets=$$(hack/control-plane.sh) && promtool=$$(hack/promtool.sh) && \
		export KUBEBUILDER_ASSETS=$$assets HELM=$(HELM) PROMTOOL=$$promtool SPILLWAY_IMAGE_LAYOUT=$(IMAGE_LAYOUT)

# flock -o: the lock is flock's own, not inherited by the tests' children;
# a service that a fault test restarts would otherwise hold it for as long
# as it runs, and every later run would wait for ever.
.PHONY: test
test: services verify-generated $(HELM) image ## Run every suite against the local Postgres, RabbitMQ, an envtest control plane and a local cluster; the fault suite last.
	$(GO) vet ./...
	$(SUITE_ENV) && \
		flock -o -s $(SERVICES_LOCK) $(GO) test $(TEST_FLAGS) $$($(GO) list ./... | grep -v -e '/test/faults$$' -e '/test/brokerfaults$$' -e '/test/dbfaults$$') && \
		flock -o -x $(SERVICES_LOCK) $(GO) test -p 1 $(TEST_FLAGS) $(FAULTS)

# The unit tier: every spec that runs against no service, which is every
# spec without a tier's label (test/tier), in every package but test/'s
# suites, each of which runs against services as a whole.
UNIT_LABELS := !db && !broker && !envtest && !process && !cluster && !faults

.PHONY: test-unit
test-unit: ## Run the unit tier: the specs that need no Postgres, RabbitMQ, API server or cluster (under a minute, with the services stopped).
	SPILLWAY_TEST_LABELS='$(UNIT_LABELS)' $(GO) test -count=1 $$($(GO) list ./... | grep -v '/test/')

STRESS_RUNS     ?= 20
STRESS_PACKAGES ?= ./drainer ./test/process

.PHONY: test-stress
test-stress: services $(HELM) ## Run the integration suites STRESS_RUNS times (default 20) with every core kept busy; stops at the first failure.
	$(SUITE_ENV) && \
		flock -o -s $(SERVICES_LOCK) env RUNS=$(STRESS_RUNS) hack/stress.sh $(STRESS_PACKAGES)

.PHONY: promtool
promtool: ## Build promtool from the Go module proxy into bin/ (cached), for the chart's alert tests.
	@hack/promtool.sh

.PHONY: control-plane
control-plane: ## Fetch the released etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (checksums checked), or build them from the Go module proxy where the downloads are unreachable, into bin/control-plane (cached).
	@hack/control-plane.sh

$(CONTROLLER_GEN):
	GOBIN=$(BIN) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(BIN)/controller-gen $@

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate the API's deepcopy functions.
	$(CONTROLLER_GEN) object paths=./api/...

$(CRD_REF_DOCS):
	GOBIN=$(BIN) $(GO) install github.com/elastic/crd-ref-docs@$(CRD_REF_DOCS_VERSION)
	mv $(BIN)/crd-ref-docs $@

.PHONY: manifests
manifests: $(CONTROLLER_GEN) $(CRD_REF_DOCS) ## Generate the CRD into config/crd/bases and the chart's crds/, the operator's RBAC into config/rbac, and the API and CLI references into docs/.
	$(CONTROLLER_GEN) crd rbac:roleName=spillway-operator paths=./api/... paths=./controllers/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	cp config/crd/bases/*.yaml charts/spillway/crds/
	$(CRD_REF_DOCS) --source-path=./api/v1alpha1 --config=hack/crd-ref-docs.yaml --renderer=markdown \
		--output-path=docs/api-reference.md --log-level=ERROR
	$(GO) run ./hack/cli-reference > docs/cli-reference.md

.PHONY: verify-generated
verify-generated: $(CONTROLLER_GEN) $(CRD_REF_DOCS) ## Fail when the generated code, manifests or references are stale.
	@CONTROLLER_GEN=$(CONTROLLER_GEN) CRD_REF_DOCS=$(CRD_REF_DOCS) hack/verify-generated.sh

# BENCH_FLAGS passes flags to the benchmark, e.g. BENCH_FLAGS=-sections=claims.
BENCH_FLAGS ?=

# The benchmark takes the services for itself: its vacuum and pooler
# sections start and stop hack/postgres-ha.sh's cluster, which a running
# make test's journey drains through, and figures measured beside the tests
# would be theirs too.
.PHONY: bench
bench: services ## Measure broker ceiling, drainer throughput, claim latency and commit→publish latency; prints ratios.
	flock -x $(SERVICES_LOCK) $(GO) run ./test/bench $(BENCH_FLAGS)

# BENCH_OPERATOR_FLAGS passes flags to it, e.g. -fleets=100 -window=30s.
BENCH_OPERATOR_FLAGS ?=

.PHONY: bench-operator
bench-operator: build image services ## Measure one operator carrying 100 and 1,000 fleets, and 100 with drainer pods: memory, CPU, API load, status writes, probe sessions, staleness, latencies, hand-over.
	@assets=$$(hack/control-plane.sh) && \
		KUBEBUILDER_ASSETS=$$assets SPILLWAY_IMAGE_LAYOUT=$(IMAGE_LAYOUT) flock -s $(SERVICES_LOCK) $(GO) run ./test/benchoperator -spillway $(BIN)/spillway $(BENCH_OPERATOR_FLAGS)

# The released helm where get.helm.sh is reachable, checked against its
# published checksum; else built from the Go module proxy.
$(HELM):
	@hack/download.sh helm $(HELM_VERSION) $@ || { \
		echo "helm: building $(HELM_VERSION) from the Go module proxy (about 1.5 minutes the first time)" && \
		start=$$(date +%s) && GOBIN=$(BIN) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION) && \
		mv $(BIN)/helm $@ && echo "helm: built in $$(($$(date +%s) - start))s"; }

.PHONY: helm
helm: $(HELM) ## Build helm into bin/ (about 1.5 minutes the first time).

.PHONY: helm-lint
helm-lint: $(HELM) ## Lint the chart with its default values and with every value set.
	$(HELM) lint --strict charts/spillway
	$(HELM) lint --strict charts/spillway --values charts/spillway/ci/all-values.yaml

# make demo builds what it lacks (the cluster's binaries take about 10
# minutes the first time, helm 1.5), then runs the journey as root: each pod
# gets mount and network namespaces of its own.
.PHONY: demo
demo: build image services $(HELM) ## The user journey on a local cluster of processes: helm install, the sample fleet draining 50,000 events, a scale-up.
	@assets=$$(hack/control-plane.sh) && start=$$(date +%s) && \
		echo "demo: building the demo (test/clusterdemo)" && $(GO) build -o $(BIN)/clusterdemo ./test/clusterdemo && \
		echo "demo: built in $$(($$(date +%s) - start))s" && \
		KUBEBUILDER_ASSETS=$$assets $(BIN)/clusterdemo -spillway $(BIN)/spillway -image-layout $(IMAGE_LAYOUT) -helm $(HELM)

.PHONY: demo-drain
demo-drain: build services ## Drain a seeded outbox in the local Postgres to RabbitMQ with two drainer processes; no cluster needed.
	$(GO) run ./test/demo -spillway $(BIN)/spillway

IMG ?= ghcr.io/spillway-io/spillway:$(VERSION)
# IMAGE_LAYOUT is where make image writes the image; REGISTRY, when set,
# is pushed to as well (REGISTRY=localhost:5000 → localhost:5000/spillway-io/spillway:VERSION).
IMAGE_LAYOUT ?= $(BIN)/image
REGISTRY     ?=

.PHONY: image
image: ## Build the image for linux/amd64 and linux/arm64 without Docker, as an OCI layout in bin/image (and pushed to REGISTRY when set); prints its digest, size and platforms.
	@$(GO) run ./hack/image -version $(VERSION) -layout $(IMAGE_LAYOUT) \
		$(if $(REGISTRY),-push $(REGISTRY)/spillway-io/spillway:$(VERSION))

.PHONY: docker-build
docker-build: ## Build the one image of the operator and its drainers with Docker, tagged IMG.
	docker build --build-arg VERSION=$(VERSION) -t $(IMG) .

STATICCHECK_VERSION ?= v0.8.2

.PHONY: lint
lint: ## gofmt, go vet and staticcheck.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
