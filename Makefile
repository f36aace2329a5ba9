# nodefence — build, test, run. Every target installs what it needs, idempotently.
SHELL := /bin/bash
.DEFAULT_GOAL := build

GO        ?= go
BIN       := $(CURDIR)/bin
TOOLS     := $(BIN)/tools
export PATH := $(TOOLS):$(PATH)

# Pinned tool versions (installed with `go install pkg@version` into ./bin/tools).
BUF_VERSION                := v1.75.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.0
GRPCURL_VERSION            := v1.9.3
STATICCHECK_VERSION        := v0.8.2

BINARIES := coordinator node-agent fence-driver fencectl nodefence-testbed bench-ingest bench-failover
APT_PACKAGES := openipmi ipmitool fence-agents dbus snmpsim snmp telnet containerd runc busybox-static containernetworking-plugins gcc curl

.PHONY: promtool run-tools run-deps chaos chaos-cluster bench-failover images kube-assets build tools deps generate lint check-generated test run demo clean bench bench-ingest bench-agent bench-drivers bench-recovery bench-pressure cluster cluster-down docs

# VERSION is stamped into every binary (`<binary> --version`, services/buildinfo) and names the
# images; the same commit gives the same VERSION, so builds stay reproducible.
VERSION         ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
VERSION_LDFLAGS := -X github.com/nodefence/nodefence/services/buildinfo.Version=$(VERSION)

build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags='$(VERSION_LDFLAGS)' -o $(BIN)/coordinator ./coordinator/cmd/coordinator
	$(GO) build -ldflags='$(VERSION_LDFLAGS)' -o $(BIN)/fencectl ./coordinator/cmd/fencectl
	$(GO) build -ldflags='$(VERSION_LDFLAGS)' -o $(BIN)/node-agent ./node-agent/cmd/node-agent
	$(GO) build -ldflags='$(VERSION_LDFLAGS)' -o $(BIN)/fence-driver ./fence-drivers/cmd/fence-driver
	$(GO) build -ldflags='$(VERSION_LDFLAGS)' -o $(BIN)/nodefence-testbed ./testbed/cmd/nodefence-testbed
	$(GO) build -ldflags='$(VERSION_LDFLAGS)' -o $(BIN)/bench-ingest ./testbed/cmd/bench-ingest
	$(GO) build -ldflags='$(VERSION_LDFLAGS)' -o $(BIN)/bench-failover ./testbed/cmd/bench-failover

# images: one OCI image-layout tarball per binary in bin/images (nodefence/<binary>:$(VERSION), and
# nodefence/etcd for deploy/etcd.yaml), built
# without a container engine or registry (testbed/images). Static, trimmed binaries and a fixed time
# (the last commit's) make the same commit give the same digests. Import with
# `ctr -n k8s.io images import bin/images/nodefence-coordinator.oci.tar`.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
images: deps
	@mkdir -p $(BIN)/linux-amd64
	for b in coordinator:coordinator node-agent:node-agent fence-driver:fence-drivers fencectl:coordinator; do \
		CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags='-s -w -buildid= $(VERSION_LDFLAGS)' \
			-o $(BIN)/linux-amd64/$${b%%:*} ./$${b#*:}/cmd/$${b%%:*} || exit 1; \
	done
	cd testbed/kube/tools/etcd && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags='-s -w -buildid=' -o $(BIN)/linux-amd64/etcd .
	$(GO) run ./testbed/cmd/nodefence-images --bin $(BIN)/linux-amd64 --out $(BIN)/images \
		--version $(VERSION) --revision $$(git rev-parse HEAD 2>/dev/null) --source-date-epoch $(SOURCE_DATE_EPOCH)

# tool NAME PKG VERSION: install PKG@VERSION as ./bin/tools/NAME unless that exact version is there.
define tool
	@if [ "$$(cat $(TOOLS)/.$(1).version 2>/dev/null)" != "$(3)" ] || [ ! -x $(TOOLS)/$(1) ]; then \
		echo "installing $(1) $(3)"; mkdir -p $(TOOLS); \
		GOBIN=$(TOOLS) $(GO) install $(2)@$(3) && echo "$(3)" > $(TOOLS)/.$(1).version; \
	fi
endef

tools:
	$(call tool,protoc-gen-go,google.golang.org/protobuf/cmd/protoc-gen-go,$(PROTOC_GEN_GO_VERSION))
	$(call tool,protoc-gen-go-grpc,google.golang.org/grpc/cmd/protoc-gen-go-grpc,$(PROTOC_GEN_GO_GRPC_VERSION))
	$(call tool,buf,github.com/bufbuild/buf/cmd/buf,$(BUF_VERSION))
	$(call tool,grpcurl,github.com/fullstorydev/grpcurl/cmd/grpcurl,$(GRPCURL_VERSION))
	$(call tool,staticcheck,honnef.co/go/tools/cmd/staticcheck,$(STATICCHECK_VERSION))

# deps: the Debian packages the tests and `make run` drive (ipmi_sim, ipmitool, fence_ipmilan, and
# for the real cluster containerd, runc, the CNI plugins). run-deps: the few `make run` needs. Each
# says what it installs and why before apt-get runs, and installs only what is missing.
RUN_APT_PACKAGES := openipmi ipmitool curl
define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "make $@: $(2) needs Debian packages that are not installed:$$missing"; \
		echo "make $@: installing them now with $${SUDO:+sudo }apt-get install (Ctrl-C to stop; nothing else is changed)"; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
endef
deps:
	$(call apt_install,$(APT_PACKAGES),the test suite (simulated BMCs and PDUs; fence agents; a real Kubernetes))
run-deps:
	$(call apt_install,$(RUN_APT_PACKAGES),make run (ipmi_sim for the simulated BMCs; ipmitool; curl))

generate: tools
	cd proto && buf format -w
	buf generate

lint: tools
	$(GO) vet ./...
	staticcheck ./...
	buf lint
	buf format --diff --exit-code
	@if git rev-parse --verify -q origin/main >/dev/null 2>&1 && git ls-tree -r --name-only origin/main -- proto | grep -q '\.proto$$'; then \
		buf breaking --against '.git#branch=origin/main'; \
	elif git rev-parse --verify -q main >/dev/null 2>&1 && git ls-tree -r --name-only main -- proto | grep -q '\.proto$$'; then \
		buf breaking --against '.git#branch=main'; \
	fi
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null | grep -v '\.pb\.go$$'))" || { gofmt -l .; echo "gofmt needed"; exit 1; }

# docs: the flag reference at the end of docs/configuration.md, from the programs' -h
# (testbed/cmd/flagdoc; its test fails when the page is stale).
docs:
	$(GO) run ./testbed/cmd/flagdoc

# check-generated: the committed generated code must be exactly what `make generate` produces.
check-generated: tools
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	buf generate -o $$tmp && \
	for f in $$(cd $$tmp && find . -name '*.go'); do cmp -s $$tmp/$$f $$f || { echo "stale generated file: $$f (run make generate)"; exit 1; }; done; \
	for f in $$(find proto -name '*.pb.go'); do [ -f $$tmp/$$f ] || { echo "generated file without proto: $$f"; exit 1; }; done; \
	echo "generated code is fresh"

# kube-assets: a real kube-apiserver and etcd built from Go modules, cached by version in
# $$HOME/.cache/nodefence (about 8 minutes the first time, instant afterwards).
kube-assets:
	$(GO) run ./testbed/kube/cmd/kube-assets

# promtool: the pinned promtool testbed/monitoring evaluates the alert rules with, built once into
# the cache the test reads (testbed/monitoring.PromtoolVersion; the test builds it too if missing),
# so that a cold build does not run inside go test beside the other packages.
PROMTOOL_BIN := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/nodefence/promtool-$(shell sed -n 's/^const PromtoolVersion = "\(.*\)"/\1/p' testbed/monitoring/rules_test.go)/promtool
promtool:
	@if [ ! -x "$(PROMTOOL_BIN)" ]; then \
		echo "building $(PROMTOOL_BIN)"; mkdir -p "$$(dirname $(PROMTOOL_BIN))"; \
		cd testbed/tools/promtool && GOWORK=off $(GO) build -trimpath -ldflags '-s -w' -o "$(PROMTOOL_BIN).tmp" github.com/prometheus/prometheus/cmd/promtool && mv "$(PROMTOOL_BIN).tmp" "$(PROMTOOL_BIN)"; \
	fi

# test: go test's events are kept in bin/test.json; testreport shows them as plain `go test` would
# (ok/FAIL per package, failing tests' output) and, at the very end, the ten slowest tests and each
# failed test's own messages (so a cut log still ends with what failed and why). The
# exit code is go test's (pipefail), then the demo's; the demo runs only after the tests passed.
#
# The packages that bring up the testbed's real cluster (CLUSTER_PKGS) take a machine-wide lock, so
# inside one `go test ./...` the second of them would hold a slot for its whole wait. They run one
# after another in a go test of their own, beside one running the rest one package at a time: two
# test binaries at once, as before, and nobody waits in a slot. Every test binary is compiled first,
# in parallel (-exec /bin/true runs none), so the two do not compile the same packages twice.
TEST_JSON := $(BIN)/test.json
CLUSTER_PKGS := ./testbed/clustere2e ./testbed/install
# CLUSTER_RUN_5: the scenario that needs five nodes (two of them a minority), after those, in a
# cluster of its own.
CLUSTER_RUN_5 := -run '^TestTwoNodeMinority$$' ./testbed/clustere2e -args -clustere2e.nodes=5
# CLUSTER_THEN_PKGS need no cluster; they run after those in the same chain so that the two go
# tests end together (the rest, one package at a time, is the longer of the two without them).
CLUSTER_THEN_PKGS := ./testbed/kubescenario
TEST_PKGS := ./...
GO_TEST := $(GO) test -race -count=1 -timeout 30m
test: deps tools check-generated lint kube-assets promtool
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/testreport ./testbed/cmd/testreport
	$(GO_TEST) -exec /bin/true $(TEST_PKGS) >/dev/null
	@echo "$(GO_TEST) -p 1 -json $(CLUSTER_PKGS), then $(CLUSTER_RUN_5), then $(CLUSTER_THEN_PKGS), beside the other packages (events in $(TEST_JSON))"
	@set -o pipefail; rc=0; \
	rest=$$($(GO) list $(TEST_PKGS) | grep -v $(foreach p,$(CLUSTER_PKGS) $(CLUSTER_THEN_PKGS),-e '$(patsubst ./%,/%,$(p))$$')); \
	{ $(GO_TEST) -p 1 -json $(CLUSTER_PKGS); a=$$?; $(GO_TEST) -json $(CLUSTER_RUN_5); b=$$?; \
	  $(GO_TEST) -p 1 -json $(CLUSTER_THEN_PKGS); c=$$?; [ $$a = 0 ] && [ $$b = 0 ] && [ $$c = 0 ]; } > $(BIN)/test-cluster.json & cluster=$$!; \
	$(GO_TEST) -p 1 -json $$rest | tee $(BIN)/test-rest.json | $(BIN)/testreport || rc=$$?; \
	wait $$cluster || rc=$$?; \
	$(BIN)/testreport < $(BIN)/test-cluster.json || rc=$$?; \
	cat $(BIN)/test-rest.json $(BIN)/test-cluster.json > $(TEST_JSON); \
	if [ $$rc = 0 ]; then $(MAKE) demo || rc=$$?; fi; \
	$(BIN)/testreport -slowest 10 < $(TEST_JSON); \
	$(BIN)/testreport -failures < $(TEST_JSON); \
	exit $$rc

# cluster: the testbed's multi-node Kubernetes (3 nodes, each in its own network namespace with its own
# containerd and kubelet, and a BMC that really powers it) in the background; prints how to use kubectl.
CLUSTER_FLAGS ?=
cluster: deps kube-assets
	$(GO) build -o $(BIN)/testbed-cluster ./testbed/cmd/testbed-cluster
	$(BIN)/testbed-cluster $(CLUSTER_FLAGS) up

cluster-down:
	$(GO) build -o $(BIN)/testbed-cluster ./testbed/cmd/testbed-cluster
	$(BIN)/testbed-cluster $(CLUSTER_FLAGS) down

# run-tools: the tools the README tour and docs/testbed.md's "Calling it" use besides bin/ (curl comes with deps).
run-tools:
	$(call tool,grpcurl,github.com/fullstorydev/grpcurl/cmd/grpcurl,$(GRPCURL_VERSION))

# run: fixed ports from 7400 (RUN_FLAGS="--port-base N" or NODEFENCE_TESTBED_PORT_BASE=N moves them),
# state in bin/run, and bin/run/env for a second terminal to source; everything stops on Ctrl-C.
RUN_FLAGS ?=
run: run-deps build run-tools
	$(BIN)/nodefence-testbed $(RUN_FLAGS) run

demo: run-deps build
	$(BIN)/nodefence-testbed demo

# bench-ingest: N agents over real gRPC streams into a real coordinator (embedded etcd); the last line
# is JSON. Override with e.g. `make bench-ingest INGEST_FLAGS="--agents 2000 --rate 5"`.
INGEST_FLAGS ?= --agents 10000 --rate 5 --warmup 10s --window 60s
bench-ingest: build
	$(BIN)/bench-ingest $(INGEST_FLAGS)

# bench-agent: the agent's footprint at 1 Hz over 60 s and its memory-pressure detection latency,
# measured on the binary as `make images` ships it (static, trimmed), in Kubernetes mode against a
# real kube-apiserver and a private containerd (--active=false: standalone).
bench-agent:
	@mkdir -p $(BIN)/linux-amd64
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w -buildid= $(VERSION_LDFLAGS)' -o $(BIN)/linux-amd64/node-agent ./node-agent/cmd/node-agent
	$(GO) run ./testbed/cmd/bench-agent --agent=$(BIN)/linux-amd64/node-agent

# bench-drivers: our driver service vs fence_ipmilan and fence_apc_snmp on the same simulators.
bench-drivers: deps
	$(GO) run ./testbed/cmd/bench-drivers -rounds 20

# bench-recovery: first, seconds from a node's agent going silent to its StatefulSet pod being
# released (power-off confirmed first), against a real kube-apiserver; 5 rounds, grace 2 s, fence
# timeout 2 s. Then, on the real multi-node cluster, seconds from a node's death to its StatefulSet
# pod Running and Ready on another node, with each nodefence round's phases: the defaults row first
# (kube-controller-manager's and nodefence's shipped settings, the operator's taint script beside
# it), then the short-settings row (grace 20 s for all: nodefence vs the taint script vs Kubernetes
# alone); its JSON is the last line.
bench-recovery: deps kube-assets build
	$(GO) run ./testbed/cmd/bench-recovery --rounds 5 --grace 2s --fence-timeout 2s
	$(GO) run ./testbed/cmd/bench-recovery-cluster --bin $(BIN) --rounds 3 --grace 20s --fence-timeout 2s

# bench-pressure: on the real multi-node cluster, milliseconds from a memory hog crossing node-1's
# hard threshold (allocatableMemory.available, pods' cgroup limited to 768 MiB) to its pod marked for
# eviction: nodefence's agent vs kubelet's eviction manager, 10 rounds each; its JSON is the last line.
PRESSURE_FLAGS ?= --rounds 10
bench-pressure: deps kube-assets build
	$(GO) run ./testbed/cmd/bench-pressure --bin $(BIN) $(PRESSURE_FLAGS)

# chaos: the long chaos run on demand (the fixed-seed short run is part of make test): 3 etcd members,
# 3 coordinators, an IPMI driver, ipmi_sim BMCs and 6 agents in network namespaces named nfc<pid>l-*,
# CHAOS_STEPS faults drawn from CHAOS_SEED (0: from the clock; the log prints it), invariants checked.
CHAOS_SEED ?= 0
CHAOS_STEPS ?= 40
chaos: deps kube-assets
	$(GO) test -count=1 -v -timeout 70m -run TestChaosLong ./testbed/chaos -args -chaos.long -chaos.seed=$(CHAOS_SEED) -chaos.steps=$(CHAOS_STEPS)

# chaos-cluster: the long no-fence scenarios on the real multi-node cluster (their short variants are
# part of make test, testbed/clustere2e TestNoFence): the coordinators on deploy/'s settings only, the
# apiserver stalled 20 s with a node's agent dead and the leader killed halfway, the apiserver slow
# (every request 2-5 s) for 2 min, a node's link flapping 3 s down / 3 s up for 1 min, its agent and
# kubelet at 1% of a CPU for 30 s, a 5 s grace below the kubelet's 10 s Lease renewal; nothing may be
# fenced or released. CHAOS_CLUSTER_ARGS adds coordinator flags (docs/no-fence.md).
CHAOS_CLUSTER_ARGS ?=
chaos-cluster: deps kube-assets
	$(GO) test -count=1 -v -timeout 60m -run 'TestNoFenceLong' ./testbed/clustere2e -args -nofence.long -nofence.args='$(CHAOS_CLUSTER_ARGS)'

# bench-failover: 3 coordinators on a 3-member etcd, N agents, a fence in flight, the leader killed
# with SIGKILL, 10 rounds; the last line is JSON. Smaller: make bench-failover FAILOVER_FLAGS="--agents 1000".
FAILOVER_FLAGS ?= --agents 10000 --rounds 10
bench-failover: deps build kube-assets
	$(BIN)/bench-failover $(FAILOVER_FLAGS)

bench: bench-ingest bench-agent bench-drivers bench-recovery

clean:
	rm -rf $(BIN)
