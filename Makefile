# safe-run — see README.md. Everything here works from a fresh clone as root
# on Debian or Ubuntu: missing parts are installed or built on demand.

SHELL := /bin/bash
GO ?= go
VERSION := $(shell git describe --always --dirty 2>/dev/null || echo dev)
# Not bin/: it holds a copy of gVisor's sources while runsc builds (bin/runsc.build).
GO_SOURCES := $(shell find . -name '*.go' -not -path './scripts/*' -not -path './bin/*') $(wildcard agent/drivers/*) go.mod go.sum rootfs/build-rootfs.sh
# Integration tests use exactly these binaries and the default image.
TEST_ENV := SAFE_RUN_INTEGRATION=1 \
	SAFE_RUN_BIN=$(CURDIR)/bin/safe-run \
	SAFE_RUN_RUNSC=$(CURDIR)/bin/runsc \
	SAFE_RUN_AGENT=$(CURDIR)/bin/safe-run-agent \
	SAFE_RUN_NET_HELPER=$(CURDIR)/bin/safe-run-net

.PHONY: all build runsc rootfs deps demo install test test-build test-unit test-security test-rootless test-cgroup-v2 test-service test-kubernetes test-kubernetes-cluster install-service uninstall-service verify-service soak vet bench bench-quick bench-check bench-monitor fuzz clean

# Where `make install` puts safe-run, the agent, the network helper, the shim
# and runsc, side by side (safe-run looks for the others next to itself).
# PREFIX=$$HOME/.local needs no root.
PREFIX ?= /usr/local

all: build runsc

build: bin/safe-run bin/safe-run-agent bin/safe-run-net bin/safe-run-shim

bin/safe-run: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $@ ./cmd/safe-run

# The agent runs inside every sandbox: static, small, nothing to load.
bin/safe-run-agent: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o $@ ./cmd/safe-run-agent

# The network helper (one per networked sandbox, on the host): static like
# the agent, and without cgo because its lockdown needs AllThreadsSyscall.
bin/safe-run-net: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o $@ ./cmd/safe-run-net

# The cgroup shim runsc starts through (one per sandbox, on the host): a
# program of its own so that it starts in a millisecond, not after
# safe-run's package initialisation. safe-run looks for it next to itself.
bin/safe-run-shim: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o $@ ./cmd/safe-run-shim

runsc: bin/runsc
bin/runsc: scripts/runsc/go.mod scripts/runsc/go.sum scripts/runsc/precompile/main.go scripts/build-runsc.sh
	scripts/build-runsc.sh $@

deps:
	@scripts/install-deps.sh

# Builds the default image unless the cache already holds this recipe's
# (rootfs/build-rootfs.sh, embedded in the binary).
rootfs: deps bin/safe-run
	bin/safe-run image build default

demo: deps build runsc rootfs
	@echo
	@echo '$$ bin/safe-run doctor'
	@bin/safe-run doctor
	@echo
	@echo '$$ bin/safe-run run --lang python -c "..."'
	@bin/safe-run run --lang python -c $$'import os, platform, numpy as np\nprint("hello from", platform.release(), "as uid", os.getuid())\nprint("numpy", np.__version__, "sum:", np.arange(10).sum())'
	@echo
	@echo '$$ bin/safe-run run --json --timeout 2s --lang bash -c "echo start; while :; do :; done"'
	@bin/safe-run run --json --timeout 2s --lang bash -c 'echo start; while :; do :; done' || echo "(exit code $$?: timeout)"

install: build runsc
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 bin/safe-run bin/safe-run-agent bin/safe-run-net bin/safe-run-shim bin/runsc $(DESTDIR)$(PREFIX)/bin/

# safe-run as a hardened systemd service (deploy/systemd/safe-run.service,
# docs/service.md), as root: binaries, the user safe-run, the unit, a config,
# a bearer token, a TLS certificate, the default image; enabled and started.
# uninstall-service removes it all but the audit log (PURGE=1: that too).
install-service: build runsc
	scripts/install-service.sh install

uninstall-service:
	scripts/install-service.sh uninstall

# systemd-analyze verify on the unit and its exposure score, without
# installing it (the binary it names is this checkout's).
verify-service: build
	scripts/test-service.sh --verify

vet:
	$(GO) vet ./...

test-unit:
	$(GO) test -count=1 ./...

# The test command of the README and of CI: unit tests plus the integration
# tests against the real runsc and the default image, one package at a time
# so that timing-sensitive checks do not compete for the two CPUs; then
# independent MCP clients (the MCP Inspector and the conformance suite)
# against the built server.
test: test-build
	$(MAKE) --no-print-directory build vet
	$(TEST_ENV) $(GO) test -count=1 -p 1 -timeout 60m ./...
	scripts/mcp-clients.sh $(CURDIR)/bin/safe-run

# What make test builds before anything else: bin/safe-run (the image's
# build needs it), then runsc beside the default image: runsc's compilation
# takes both CPUs for minutes, the image's build mostly the network and the
# disk. CI runs it as a step of its own to start the control plane's build
# once it is done.
test-build: deps
	$(MAKE) --no-print-directory bin/safe-run
	$(MAKE) --no-print-directory -j2 runsc rootfs

# The kubernetes backend against a real control plane: etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager, kwok (a fake node whose pods/exec
# runs on this host) and the agent-sandbox controller, built once from the Go
# module proxy at pinned versions into /var/cache/safe-run/kubernetes
# (SAFE_RUN_KUBERNETES_CACHE to move it; 10-25 min cold on 2 CPUs, then
# nothing; the tests then take about 2 min). The last line drives the
# safe-run binary itself (serve over MCP, run, doctor) against it.
# SAFE_RUN_KUBERNETES=1 makes a missing binary fail the tests instead of
# skipping them.
test-kubernetes: build
	scripts/kubernetes/build-control-plane.sh
	SAFE_RUN_KUBERNETES=1 SAFE_RUN_KUBERNETES_BIN=$$(scripts/kubernetes/build-control-plane.sh --print-dir) \
		$(TEST_ENV) $(GO) test -count=1 -p 1 -timeout 30m ./runtime/kubernetes/... ./deploy/kubernetes/
	SAFE_RUN_KUBERNETES=1 SAFE_RUN_KUBERNETES_BIN=$$(scripts/kubernetes/build-control-plane.sh --print-dir) \
		$(TEST_ENV) $(GO) test -count=1 -timeout 10m -run '^(TestDoctorKubernetes|TestKubernetesEndToEnd|TestKubernetesHTTPReplicas)$$' ./cmd/safe-run/

# The manifests' test against a real cluster (real kubelets, the gVisor
# RuntimeClass, the image pulled): make test-kubernetes-cluster KUBECONFIG=FILE.
# It applies deploy/kubernetes to the cluster (namespace safe-run) and leaves it there.
test-kubernetes-cluster:
	@test -n "$(KUBECONFIG)" || { echo "give the cluster's admin kubeconfig: make test-kubernetes-cluster KUBECONFIG=FILE"; exit 2; }
	SAFE_RUN_KUBECONFIG=$(abspath $(KUBECONFIG)) $(GO) test -count=1 -v -timeout 10m ./deploy/kubernetes/

# Side-by-side latency and throughput of each layer (chroot, runsc, the CLI,
# MCP with the pool off and on), the warm pool spaced and back to back, CPU
# and memory per sandbox, issue 17's targets; then the behaviour monitor's
# overhead at off, default and full (bench-monitor below). Rewrites the
# benchmark tables in docs/benchmarks.md. About 22 minutes on 2 busy CPUs.
bench: deps build runsc rootfs
	$(GO) run ./scripts/bench -safe-run bin/safe-run -runsc bin/runsc -agent bin/safe-run-agent $(BENCH_FLAGS)
	$(GO) run ./scripts/bench -monitor -safe-run bin/safe-run -runsc bin/runsc -agent bin/safe-run-agent $(BENCH_FLAGS)

# The same in a few minutes, with fewer runs per row and no network rows;
# written to scripts/bench/results/quick.{md,json}, docs/benchmarks.md untouched.
bench-quick: deps build runsc rootfs
	$(GO) run ./scripts/bench -quick -safe-run bin/safe-run -runsc bin/runsc -agent bin/safe-run-agent $(BENCH_FLAGS)

# 100 print(i) blocks: `safe-run check -j 2` against 100 `safe-run run` calls,
# in one run; rewrites the bench-check table of docs/benchmarks.md.
bench-check: deps build runsc rootfs
	$(GO) run ./scripts/bench -check -safe-run bin/safe-run -runsc bin/runsc -agent bin/safe-run-agent $(BENCH_FLAGS)

# The behaviour monitor's overhead: print(1), import pandas and a file-heavy
# program, cold, at --monitor off, default and full, interleaved; docs/benchmarks.md's
# monitor table. About 8 minutes at the default 30 runs; part of make bench.
bench-monitor: deps build runsc rootfs
	$(GO) run ./scripts/bench -monitor -safe-run bin/safe-run -runsc bin/runsc -agent bin/safe-run-agent $(BENCH_FLAGS)

# Each fuzz target for FUZZTIME, e.g. `make fuzz FUZZTIME=5m`. The seed
# corpora are in each package's testdata/fuzz/; an input that fails is added
# there. Temporary files go to a tmpfs when there is one: the targets make
# and remove directories by the thousand, which ext4 slows to a crawl.
# Minimizing is bounded, since inputs whose coverage differs from run to
# run would otherwise stall the run for a minute each. The fuzzing engine
# of Go 1.26 can fail a target with "context deadline exceeded" as its
# -fuzztime ends, no input found (go.dev/issue/75804, fixed in Go 1.27):
# the targets run with FUZZ_TOOLCHAIN, which the go command fetches from the
# module proxy like a module (GOTOOLCHAIN=local to use the installed Go).
FUZZTIME ?= 10s
FUZZ_TOOLCHAIN ?= go1.27.3
FUZZ_TARGETS := sandbox:FuzzCheckPath sandbox:FuzzPolicyCheck mcp:FuzzRunCodeArgs mcp:FuzzSessionToolArgs \
	agent:FuzzWorkspacePaths rootfs:FuzzExtract rootfs:FuzzImageConfig
FUZZ_TARGETS += mcp:FuzzEscapeName snippets:FuzzParse
FUZZ_TARGETS += egress:FuzzParse egress:FuzzAnswerDNS egress:FuzzParseSNI egress:FuzzParseHTTPHost egress:FuzzHTTPRequests
FUZZ_TARGETS += monitor:FuzzDecode
fuzz:
	@set -e; tmp=$$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	for t in $(FUZZ_TARGETS); do \
		echo "== $${t#*:} (./$${t%%:*}, $(FUZZTIME))"; \
		TMPDIR=$$tmp GOTOOLCHAIN=$(FUZZ_TOOLCHAIN) $(GO) test -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 1s ./$${t%%:*}; \
	done

# The threat suite (every case of the threat catalogue through the CLI and
# MCP, with host checks and positive controls), the seccomp controls and the
# host faults. `make test` runs them too.
test-security: deps build runsc rootfs
	$(TEST_ENV) $(GO) test -count=1 -p 1 -timeout 30m -run '^(TestThreat|TestSeccomp|TestFault)' ./cmd/safe-run/

# SOAK_RUNS mixed runs (every language; failures, timeouts, OOMs) through
# one MCP server at concurrency 8; prints a summary. CI runs 200.
SOAK_RUNS ?= 1000
soak: deps build runsc rootfs
	SAFE_RUN_SOAK_RUNS=$(SOAK_RUNS) $(TEST_ENV) $(GO) test -count=1 -timeout 60m -v -run '^TestSoak$$' ./cmd/safe-run/

# The integration tests again as an ordinary user (uid 65534), as desktop MCP
# clients start safe-run. Run as root after `make test`.
test-rootless: build runsc rootfs
	scripts/test-rootless.sh

# Memory, pids and CPU limits of a safe-run without root in a delegated
# cgroup v2, checked in a QEMU VM (software emulation, 3-7 min): this host's
# cgroup v1 controllers cannot be delegated. Installs qemu-system-x86 if missing; run as root.
test-cgroup-v2: build runsc rootfs
	scripts/test-cgroup-v2.sh

# The service end to end in a QEMU VM with systemd as process 1 (software
# emulation): make install-service's steps, then HTTPS, limits, audit,
# restart and stop through the real unit. Run as root.
test-service: build runsc rootfs
	scripts/test-service.sh

clean:
	rm -rf bin
