# kpsim: the two set-up commands are `make run` and `make test`.
#
#   make run      build sim and simulate scenarios/1000-services.yaml (prints
#                 the summary; writes no file)
#   make test     install what the tests need (Debian packages included,
#                 idempotently), then run every test tier; as root the
#                 namespace tier runs and a skipped test is a failure
#   make test-vm  the IPVS conformance suite, in a qemu microVM when this
#                 kernel has no IPVS (vm-assets, then sim conform --mode ipvs)
#   make vm-assets  what the VM tier needs: bin/sim (static), qemu-system-x86
#                 when the VM will run, and the Debian kernel and busybox in
#                 ~/.cache/kpsim/vm (idempotent; make test runs it first)
#   make build    build bin/sim and the upstream programs (make upstream)
#   make cluster-tools  a real local cluster's programs (kubelet,
#                 kube-controller-manager, kube-scheduler, containerd, runc,
#                 CNI plugins, pause) into bin/; cached; harness/cluster
#   make upstream etcd, kube-apiserver and kube-proxy (the pinned releases of
#                 harness/upstream/tools) into bin/, for --subject kube-proxy;
#                 cached, about 10 minutes of both cores the first time
#   make conformance-upstream  the conformance suite on the unmodified
#                 kube-proxy in iptables and nftables mode (root)
#   make soak     sim soak scenarios/soak.yaml, N = 2,000 changes with every
#                 50th kernel apply failing, in iptables and nftables mode
#   make bench    benchmarks (loading, engines, statistics)
#   make lint     go vet and staticcheck (make test runs it first and fails
#                 on any finding)
#   make fresh-check  clone HEAD into a temporary folder and run .ci/run there
#                 with empty HOME, Go module and build caches and VM cache, as
#                 on a brand-new machine; prints the wall time
#   make fuzz     every fuzz target for FUZZTIME (10m) each, one after another
#   make diagnose-dumps  regenerate sim diagnose's round-trip data
#                 (harness/diagnose/testdata/dumps: sim conform --dump per
#                 mode, correct and per named fault; root, about 4 minutes)
#   make results  regenerate the committed outputs in results/ (sim run
#                 scenarios/1000-services.yaml --out results/1000-services)

SHELL       := /bin/bash
GO          ?= go
BIN         := bin/sim
VERSION     := $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -X github.com/kpsim/kpsim/cmd/sim/app.Version=$(VERSION)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# One build configuration for everything but the race detector: bin/sim is
# static (it also boots the microVM), and go vet, staticcheck and the
# upstream programs (built static, as Kubernetes' releases are) compile with
# the same settings, so a new machine compiles the dependency tree once for
# them (and once more, with cgo, for go test -race).
export CGO_ENABLED ?= 0
# Debian packages the test tiers use: netfilter userland for the namespace
# tier, iproute2 for inspection, ipvsadm (copied into the microVM: the IPVS
# dumps of sim conform --dump), gcc and libc6-dev for the race detector
# (go test -race needs cgo).
DEB_PACKAGES := iptables nftables ipset conntrack iproute2 ipvsadm gcc libc6-dev
TEST_DIR    := $(or $(TMPDIR),/tmp)
TEST_LOG    := $(TEST_DIR)/kpsim-test.log

.PHONY: diagnose-external diagnose-dumps-ipvs diagnose-testdata diagnose-testdata-nft import-fixtures calibrate-ipvs sim upstream upstream-bg upstream-wait conformance-upstream harness-calibration fuzz fuzz-short fuzz-run host-snapshot test-go run test test-vm vm-assets build bench lint results capacity-results deps check-skips conformance soak calibrate fresh-check clean

# build makes bin/sim and the upstream programs of the kube-proxy subject
# (make upstream); make run needs bin/sim only.
build: sim upstream

sim:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/sim

# run prints the summary only: sim run writes files only with --out, so a
# run (any seed) never changes the committed results/.
run: sim
	$(BIN) run scenarios/1000-services.yaml

# upstream builds the kube-proxy subject's programs into bin/: etcd, and
# kube-apiserver and kube-proxy at the release pinned in
# harness/upstream/tools/kubernetes/go.mod, each from its nested module (the
# main module never requires k8s.io/kubernetes). The version ldflags are the
# ones Kubernetes' own build sets, so kube-proxy --version names the release.
# Cached: a binary is rebuilt only when its module's go.mod or go.sum changes.
# Cold on two cores: see harness/upstream/README.md.
UPSTREAM     := harness/upstream/tools
KUBE_VERSION  = $(shell sed -n 's/^\tk8s.io\/kubernetes v\([^ ]*\).*/v\1/p' $(UPSTREAM)/kubernetes/go.mod)
KUBE_LDFLAGS  = -s -w $(foreach p,k8s.io/client-go/pkg/version k8s.io/component-base/version,\
	-X $(p).gitVersion=$(KUBE_VERSION) -X $(p).gitTreeState=clean \
	-X $(p).gitMajor=$(word 1,$(subst ., ,$(KUBE_VERSION:v%=%))) -X $(p).gitMinor=$(word 2,$(subst ., ,$(KUBE_VERSION:v%=%))))
upstream: bin/etcd bin/kube-apiserver bin/kube-proxy

# upstream-bg starts make upstream in the background under nice 19 (its
# output in $(UPSTREAM_LOG)), then compiles the module's packages for the
# race detector (go build -race ./...: the compile test-go would otherwise
# start with, done in the CPU the tiers before it leave idle; test-go finds
# it in the build cache). upstream-wait waits for both and fails, with the
# log, if either failed. Without upstream-bg, upstream-wait builds.
UPSTREAM_LOG := $(TEST_DIR)/kpsim-upstream-build.log
upstream-bg:
	@rm -f $(UPSTREAM_LOG).rc; echo "make test: building the upstream programs, then the race build, in the background (log: $(UPSTREAM_LOG))"; \
	( nice -n 19 $(MAKE) --no-print-directory upstream > $(UPSTREAM_LOG) 2>&1 && \
	  { start=$$(date +%s); CGO_ENABLED=1 nice -n 19 $(GO) build -race ./... >> $(UPSTREAM_LOG) 2>&1 && \
	    echo "compiled ./... for the race detector in $$(( $$(date +%s) - start )) s" >> $(UPSTREAM_LOG); }; \
	  echo $$? > $(UPSTREAM_LOG).rc ) </dev/null >/dev/null 2>&1 & \
	echo $$! > $(UPSTREAM_LOG).pid

upstream-wait:
	@if [ ! -e $(UPSTREAM_LOG) ]; then $(MAKE) --no-print-directory upstream; exit $$?; fi; \
	start=$$(date +%s); pid=$$(cat $(UPSTREAM_LOG).pid 2>/dev/null); \
	while [ ! -s $(UPSTREAM_LOG).rc ] && kill -0 "$$pid" 2>/dev/null; do sleep 2; done; \
	rc=$$(cat $(UPSTREAM_LOG).rc 2>/dev/null || echo "none: the background build is gone"); cat $(UPSTREAM_LOG); \
	echo "make test: upstream and race builds finished (exit $$rc; waited $$(( $$(date +%s) - start )) s for it)"; \
	rm -f $(UPSTREAM_LOG) $(UPSTREAM_LOG).rc $(UPSTREAM_LOG).pid; [ "$$rc" = 0 ] || { echo "make upstream failed (see above)"; exit 1; }

bin/kube-apiserver bin/kube-proxy &: $(UPSTREAM)/kubernetes/go.mod $(UPSTREAM)/kubernetes/go.sum
	@mkdir -p bin
	@start=$$(date +%s); cd $(UPSTREAM)/kubernetes && \
	$(GO) build -trimpath -ldflags "$(KUBE_LDFLAGS)" -o $(CURDIR)/bin/ k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-proxy && \
	echo "built bin/kube-apiserver bin/kube-proxy $(KUBE_VERSION) in $$(( $$(date +%s) - start )) s"

bin/etcd: $(UPSTREAM)/etcd/go.mod $(UPSTREAM)/etcd/go.sum
	@mkdir -p bin
	@start=$$(date +%s); cd $(UPSTREAM)/etcd && \
	$(GO) build -trimpath -ldflags "-s -w" -o $(CURDIR)/bin/etcd go.etcd.io/etcd/server/v3 && \
	echo "built bin/etcd in $$(( $$(date +%s) - start )) s"

# cluster-tools builds a real local cluster's programs into bin/ (see
# harness/cluster/README.md; not part of make build or make test): kubelet,
# kube-controller-manager and kube-scheduler at the release
# $(UPSTREAM)/kubernetes pins for kube-apiserver and kube-proxy, from their
# own nested module $(UPSTREAM)/cluster (so their extra dependencies never
# move the pinned kube-apiserver's and kube-proxy's); containerd, its runc
# shim, ctr, runc and the CNI plugins ptp, host-local and loopback from
# $(UPSTREAM)/node; the local pause image's binary, kpsim-cluster and
# kpsim-agent (harness/agent: static, stripped) from the main module.
# runc needs cgo and libseccomp (CLUSTER_DEB_PACKAGES,
# installed by cluster-deps as root: the kubelet always asks for the
# RuntimeDefault seccomp profile for a pod's sandbox, whatever
# seccompDefault says, and a runc without seccomp fails it) and is built
# without libpathrs (a Rust library). Cached like make upstream: a nested
# module's binaries are rebuilt only when its go.mod or go.sum changes.
# Each binary's build time is printed (one after another, each reusing the
# build cache the previous ones filled). make cluster-tools names one
# binary of each grouped rule (the rule makes the whole group).
CLUSTER_MOD  := $(UPSTREAM)/cluster
NODE_MOD     := $(UPSTREAM)/node
CLUSTER_KUBE_VERSION = $(shell sed -n 's/^\tk8s.io\/kubernetes v\([^ ]*\).*/v\1/p' $(CLUSTER_MOD)/go.mod)
modversion    = $(shell sed -n 's/^\t$(subst /,\/,$(1)) \(v[^ ]*\).*/\1/p' $(NODE_MOD)/go.mod)
CNI_PLUGINS  := main/ptp ipam/host-local main/loopback
CLUSTER_DEB_PACKAGES := gcc libc6-dev libseccomp-dev
.PHONY: cluster-tools cluster-deps kpsim-cluster kpsim-agent
cluster-tools: cluster-deps
	@$(MAKE) --no-print-directory bin/kubelet bin/containerd bin/runc bin/cni/ptp bin/pause kpsim-cluster kpsim-agent

cluster-deps:
	@$(MAKE) --no-print-directory deps DEB_PACKAGES="$(CLUSTER_DEB_PACKAGES)"

bin/kubelet bin/kube-controller-manager bin/kube-scheduler &: $(CLUSTER_MOD)/go.mod $(CLUSTER_MOD)/go.sum
	@[ "$(CLUSTER_KUBE_VERSION)" = "$(KUBE_VERSION)" ] || { echo "$(CLUSTER_MOD) pins $(CLUSTER_KUBE_VERSION), $(UPSTREAM)/kubernetes $(KUBE_VERSION): pin one release"; exit 1; }
	@mkdir -p bin
	@cd $(CLUSTER_MOD) && for c in kubelet kube-controller-manager kube-scheduler; do start=$$(date +%s); \
		$(GO) build -trimpath -ldflags "$(KUBE_LDFLAGS)" -o $(CURDIR)/bin/$$c k8s.io/kubernetes/cmd/$$c || exit 1; \
		echo "built bin/$$c $(KUBE_VERSION) in $$(( $$(date +%s) - start )) s"; done

bin/containerd bin/containerd-shim-runc-v2 bin/ctr &: $(NODE_MOD)/go.mod $(NODE_MOD)/go.sum
	@mkdir -p bin
	@v=$(call modversion,github.com/containerd/containerd/v2); cd $(NODE_MOD) && for c in containerd containerd-shim-runc-v2 ctr; do \
		start=$$(date +%s); tags=urfave_cli_no_docs; [ $$c = containerd-shim-runc-v2 ] && tags="$$tags no_grpc"; \
		$(GO) build -trimpath -tags "$$tags" -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$$v" \
			-o $(CURDIR)/bin/$$c github.com/containerd/containerd/v2/cmd/$$c || exit 1; \
		echo "built bin/$$c $$v in $$(( $$(date +%s) - start )) s"; done

bin/runc: $(NODE_MOD)/go.mod $(NODE_MOD)/go.sum
	@mkdir -p bin
	@v=$(call modversion,github.com/opencontainers/runc); start=$$(date +%s); cd $(NODE_MOD) && \
	CGO_ENABLED=1 $(GO) build -trimpath -tags "seccomp urfave_cli_no_docs" -ldflags "-s -w -X main.version=$${v#v}" -o $(CURDIR)/bin/runc github.com/opencontainers/runc && \
	echo "built bin/runc $$v (cgo, seccomp) in $$(( $$(date +%s) - start )) s"

$(addprefix bin/cni/,$(notdir $(CNI_PLUGINS))) &: $(NODE_MOD)/go.mod $(NODE_MOD)/go.sum
	@mkdir -p bin/cni
	@v=$(call modversion,github.com/containernetworking/plugins); cd $(NODE_MOD) && for p in $(CNI_PLUGINS); do start=$$(date +%s); \
		$(GO) build -trimpath -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$$v" \
			-o $(CURDIR)/bin/cni/$${p#*/} github.com/containernetworking/plugins/plugins/$$p || exit 1; \
		echo "built bin/cni/$${p#*/} $$v in $$(( $$(date +%s) - start )) s"; done

bin/pause: harness/cluster/pause/main.go
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o bin/pause ./harness/cluster/pause

kpsim-cluster:
	$(GO) build -o bin/kpsim-cluster ./harness/cluster/cmd/kpsim-cluster

kpsim-agent:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o bin/kpsim-agent ./harness/agent/cmd/kpsim-agent

# deps installs the Debian packages once (apt-get only when one is missing).
deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" != 0 ]; then echo "make test: missing Debian packages:$$missing (run as root to install them)"; exit 3; fi; \
		echo "installing:$$missing"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "Debian packages present: $(DEB_PACKAGES)"; fi

# test runs lint (go vet and staticcheck: any finding fails), then every
# tier. As root (CI), KPSIM_REQUIRE_ALL=1 turns the skip of a privileged test
# into a failure, and check-skips fails on any skipped test.
# The VM assets come first: a Go test resolves the VM's modules on the
# cached kernel. As a normal user they are not fetched (apt-get needs root)
# and that test skips, like the other privileged ones.
#
# The upstream programs (make upstream: about 10 minutes of both cores on a
# new machine) build in the background at the lowest priority from the
# start, on the CPU the earlier tiers leave idle (the microVM's emulation
# uses one core); the tiers that run them come last, after upstream-wait.
test: deps sim
	@$(MAKE) --no-print-directory upstream-bg
	@$(MAKE) --no-print-directory lint
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory vm-assets; fi
	@$(MAKE) --no-print-directory host-snapshot SNAPSHOT=$(TEST_DIR)/kpsim-host-before.txt
	@$(MAKE) --no-print-directory conformance
	@$(MAKE) --no-print-directory soak
	@$(MAKE) --no-print-directory test-vm
	@$(MAKE) --no-print-directory upstream-wait
	@$(MAKE) --no-print-directory test-go
	@$(MAKE) --no-print-directory conformance-upstream
	@$(MAKE) --no-print-directory host-snapshot SNAPSHOT=$(TEST_DIR)/kpsim-host-after.txt
	@diff -u $(TEST_DIR)/kpsim-host-before.txt $(TEST_DIR)/kpsim-host-after.txt \
		|| { echo "make test: the host's network state changed during the tests (see the diff above)"; exit 1; }
	@echo "host network state unchanged (iptables-save, iptables-legacy-save, nft list ruleset, ip netns, root links)"
	@$(MAKE) --no-print-directory check-skips

# host-snapshot records the root namespace's rules, namespaces and links, the
# conntrack table size (its hash size is global and writable from any
# namespace: kube-proxy runs with --conntrack-max-per-core=0) and the sysctls
# kube-proxy sets in its own namespace, so that make test can prove the tests
# left the host as it was.
host-snapshot:
	@{ echo "## iptables-save"; iptables-save 2>/dev/null | grep -v '^#'; \
	   echo "## iptables-legacy-save"; iptables-legacy-save 2>/dev/null | grep -v '^#'; \
	   echo "## nft list ruleset"; nft list ruleset 2>/dev/null; \
	   echo "## ip netns"; ip netns list 2>/dev/null; \
	   echo "## links"; ip -o link show 2>/dev/null | sed 's/^[0-9]*: //' | cut -d' ' -f1 | sort; \
	   echo "## conntrack (hashsize is global to the machine)"; cat /sys/module/nf_conntrack/parameters/hashsize 2>/dev/null; \
	   sysctl -n net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established \
		net.netfilter.nf_conntrack_tcp_timeout_close_wait net.ipv4.conf.all.route_localnet 2>/dev/null; } > $(SNAPSHOT)

# test-go runs every package under the race detector, the namespace tier
# included: its sync loops, probers and observers are where goroutines meet
# (-race found a sync loop outliving its namespaces and Counters racing
# Sync there). On two cores the race build takes about 5 minutes of a cold
# cache (upstream-bg does it in the background) and the run takes about
# twice as long as without it. Test binaries link without symbol tables or
# DWARF (-s -w: about a fifth of each link; stack traces keep their names).
# KPSIM_SIM_BIN hands the kill soak (cmd/sim) the sim just built.
# The longest packages come first on the command line (go test starts
# packages in that order, two at a time on two cores): the differential test
# (its four mode runs two at a time, mostly waiting on kube-proxy's syncs)
# and the conformance tests; listed last, they were the run's tail.
TEST_GO_FIRST := ./harness/differential ./harness/conform
test-go: sim
	@if [ "$$(id -u)" = 0 ]; then export KPSIM_REQUIRE_ALL=1; fi; \
	KPSIM_SIM_BIN=$(CURDIR)/$(BIN) CGO_ENABLED=1 $(GO) test -race -ldflags="-s -w" -count=1 -timeout 30m -v $(TEST_GO_FIRST) ./... > $(TEST_LOG) 2>&1; status=$$?; \
	grep -E '^(ok|FAIL|panic|---)|^\s+--- (FAIL|SKIP)|^\s+[a-z_]+\.go:[0-9]+:' $(TEST_LOG) | grep -v -- '--- PASS' ; \
	$(MAKE) --no-print-directory check-skips || status=1; exit $$status

# conformance runs the suite through the real kernel: iptables mode with both
# iptables backends, nftables mode in both layouts (root: it builds its own
# namespaces), writing JUnit and Markdown next to the test log.
conformance: sim
	@if [ "$$(id -u)" != 0 ]; then echo "make conformance: needs root (it creates network namespaces; nothing on the host changes)"; exit 3; fi
	$(BIN) conform scenarios/conformance/ --mode iptables --iptables-backend nft \
		--junit $(TEST_DIR)/kpsim-junit-iptables-nft.xml --summary $(TEST_DIR)/kpsim-summary-iptables-nft.md
	$(BIN) conform scenarios/conformance/ --mode iptables --iptables-backend legacy \
		--junit $(TEST_DIR)/kpsim-junit-iptables-legacy.xml --summary $(TEST_DIR)/kpsim-summary-iptables-legacy.md
	$(BIN) conform scenarios/conformance/ --mode nftables --layout kube-proxy \
		--junit $(TEST_DIR)/kpsim-junit-nftables-kube-proxy.xml --summary $(TEST_DIR)/kpsim-summary-nftables-kube-proxy.md
	$(BIN) conform scenarios/conformance/ --mode nftables --layout fast \
		--junit $(TEST_DIR)/kpsim-junit-nftables-fast.xml --summary $(TEST_DIR)/kpsim-summary-nftables-fast.md
	@for mode in iptables nftables ipvs; do \
		$(BIN) conform scenarios/conformance/*.yaml --mode $$mode --calibrate $(CALIBRATE_RUNS) || exit 1; \
	done

# conformance-upstream runs the suite on the second subject: the unmodified
# kube-proxy (bin/kube-proxy, make upstream) against a real kube-apiserver
# and etcd in the run's namespaces, in iptables and nftables mode (root).
conformance-upstream: sim upstream
	@if [ "$$(id -u)" != 0 ]; then echo "make conformance-upstream: needs root (it creates network namespaces; nothing on the host changes)"; exit 3; fi
	@for mode in iptables nftables; do \
		$(BIN) conform scenarios/conformance/ --subject kube-proxy --mode $$mode \
			--junit $(TEST_DIR)/kpsim-junit-kube-proxy-$$mode.xml --summary $(TEST_DIR)/kpsim-summary-kube-proxy-$$mode.md || exit 1; \
	done

# test-cluster is issue 32's proof on a real local cluster (root; not part of
# make test): sim conform --kubeconfig on three-node clusters with the
# unmodified kube-proxy in iptables and nftables mode (exit 0, the same
# verdicts as the namespace run), and kpsim's dataplane as the node proxy
# with and without --proxy-fault uniform-probability (exit 1 and 0); the
# host snapshot unchanged (harness/cluster/test-cluster.sh; reports in
# /tmp/kpsim-test-cluster).
.PHONY: test-cluster
test-cluster: sim upstream cluster-tools
	@if [ "$$(id -u)" != 0 ]; then echo "make test-cluster: needs root (a local cluster in namespaces of its own; nothing on the host changes)"; exit 3; fi
	sh harness/cluster/test-cluster.sh

# diagnose-dumps regenerates sim diagnose's round-trip test data
# (harness/diagnose/testdata/dumps/, committed; never edit it by hand): sim
# conform --dump over scenarios/testdata/diagnose/ in iptables mode (both
# backends) and nftables mode (kube-proxy's layout), on the correct dataplane
# and with each named fault on the scenario whose check catches it. One
# archive per run (CONFIG-CASE.tar.gz: the dump folder, manifest.json at its
# top; tar xzf to read it). A fault run exits 1 (its check failed): any
# other exit but 0 stops the target. Root; run it under the heavy lock:
# flock /tmp/kpsim-heavy.lock make diagnose-dumps (224 s here, 148 kB).
DIAGNOSE_DUMPS = harness/diagnose/testdata/dumps
DIAGNOSE_SCENARIOS = scenarios/testdata/diagnose
DIAGNOSE_CONFIGS = iptables-nft:--mode=iptables,--iptables-backend=nft iptables-legacy:--mode=iptables,--iptables-backend=legacy \
	nftables:--mode=nftables,--layout=kube-proxy
DUMP_BIN ?= $(BIN)
DUMP_TIMEOUT ?= 900
DIAGNOSE_FAULTS = uniform-probability:fair skew-at-mde:fair drop-last-endpoint:fair keep-not-ready:flapping \
	keep-deleted-endpoint:terminating ignore-local-policy:local affinity-no-timeout:affinity
.PHONY: diagnose-dumps
# diagnose-external regenerates sim diagnose's external-path fixtures
# (harness/diagnose/testdata/external): our dataplane and kube-proxy after
# traffic from outside the cluster (root; about 2 minutes, IPVS in the
# microVM included; SKIP_IPVS=1 leaves it out).
diagnose-external: sim upstream
	@if [ "$$(id -u)" != 0 ]; then echo "make diagnose-external: needs root (it creates network namespaces; nothing on the host changes)"; exit 3; fi
	flock /tmp/kpsim-heavy.lock sh harness/diagnose/testdata/external/gen-external.sh $(BIN)

diagnose-dumps: sim
	@if [ "$$(id -u)" != 0 ]; then echo "make diagnose-dumps: needs root (it creates network namespaces; nothing on the host changes)"; exit 3; fi
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; start=$$(date +%s); \
	mkdir -p $(DIAGNOSE_DUMPS) || exit 1; for cfg in $(DIAGNOSE_CONFIGS); do rm -f $(DIAGNOSE_DUMPS)/$${cfg%%:*}-*.tar.gz; done; \
	one() { name=$$1; flags=$$2; case=$$3; shift 3; d=$$tmp/$$name-$$case; t0=$$(date +%s); \
		timeout $(DUMP_TIMEOUT) $(DUMP_BIN) conform "$$@" $$(echo $$flags | tr , ' ') --dump $$d >$$d.log 2>&1; rc=$$?; \
		if [ $$rc -gt 1 ] || [ ! -f $$d/manifest.json ]; then echo "make diagnose-dumps: $$name $$case: sim conform exited $$rc"; tail -20 $$d.log; return 1; fi; \
		tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C $$d -cf - . | gzip -9n > $(DIAGNOSE_DUMPS)/$$name-$$case.tar.gz || return 1; \
		echo "diagnose-dumps: $$name-$$case: exit $$rc, $$(( $$(date +%s) - t0 )) s, $$(wc -c < $(DIAGNOSE_DUMPS)/$$name-$$case.tar.gz) bytes"; }; \
	for cfg in $(DIAGNOSE_CONFIGS); do name=$${cfg%%:*}; flags=$${cfg#*:}; \
		one $$name $$flags correct $(DIAGNOSE_SCENARIOS)/ || exit 1; \
		for fc in $(DIAGNOSE_FAULTS); do fault=$${fc%%:*}; sc=$${fc#*:}; \
			one $$name $$flags $$fault --fault $$fault $(DIAGNOSE_SCENARIOS)/$$sc.yaml || exit 1; \
		done; \
	done; \
	echo "diagnose-dumps: $$(( $$(date +%s) - start )) s in all, $$(du -cb $(DIAGNOSE_DUMPS)/*.tar.gz | tail -1 | cut -f1) bytes in $(DIAGNOSE_DUMPS)"

# diagnose-dumps-ipvs: the same for IPVS mode (ipvs-CASE.tar.gz: ipvsadm -Ln,
# -Ln --stats --exact and -Lnc of the client node), in the microVM of
# harness/vm when this kernel has no IPVS (vm-assets; the static sim boots
# it, the guest's dump folder comes back over 9p). Each run is one boot:
# slower than the namespaces (software emulation), hence the longer bound.
# Root, under the heavy lock: flock /tmp/kpsim-heavy.lock make diagnose-dumps-ipvs
diagnose-dumps-ipvs: vm-assets
	@$(MAKE) --no-print-directory diagnose-dumps DIAGNOSE_CONFIGS=ipvs:--mode=ipvs DUMP_BIN=$(VM_BIN) DUMP_TIMEOUT=2400 \
		DIAGNOSE_FAULTS="$(DIAGNOSE_FAULTS_IPVS)"
DIAGNOSE_FAULTS_IPVS ?= $(DIAGNOSE_FAULTS)

# harness-calibration checks the checker at length and writes
# results/harness-calibration/: the whole suite on the simulated machine
# (HARNESS_RUNS runs per mode, false-failure rate against the family alpha),
# then REPEAT_RUNS real runs per mode on this kernel with fixed-size tests of
# the scenarios whose verdicts are chi-squares (each verdict's p-values tested
# for uniformity). Root; about 40 minutes.
HARNESS_RUNS ?= 1000
REPEAT_SCENARIOS = scenarios/conformance/distribution.yaml scenarios/conformance/many-endpoints.yaml scenarios/conformance/internal-traffic-local.yaml
REPEAT_RUNS ?= 30
harness-calibration: sim
	@mkdir -p results/harness-calibration
	@for mode in iptables nftables ipvs; do \
		$(BIN) conform scenarios/conformance/*.yaml --mode $$mode --calibrate $(HARNESS_RUNS) \
			--checker-json results/harness-calibration/simulated-$$mode.json | tee results/harness-calibration/simulated-$$mode.txt || exit 1; \
	done
	@for mode in iptables nftables; do \
		$(BIN) conform $(REPEAT_SCENARIOS) --mode $$mode --repeat $(REPEAT_RUNS) --fixed \
			--checker-json results/harness-calibration/repeat-$$mode.json | tee results/harness-calibration/repeat-$$mode.txt || exit 1; \
	done

# soak drives 2,000 seeded API changes through the real sync loop in each
# mode with every 50th kernel apply failing (root: it builds its own
# namespaces), then requires each node's kernel to equal a fresh render, no
# leak and no RSS growth (about 30 s per mode on two cores).
# CALIBRATE_RUNS: simulated whole-suite runs per mode in make conformance
# (the harness checking its own false-failure rate; about 0.15 s a run).
CALIBRATE_RUNS ?= 200
SOAK_EVENTS ?= 2000
SOAK_FAIL   ?= 50
soak: sim
	@if [ "$$(id -u)" != 0 ]; then echo "make soak: needs root (it creates network namespaces; nothing on the host changes)"; exit 3; fi
	@status=0; for mode in iptables nftables; do \
		start=$$(date +%s); \
		$(BIN) soak scenarios/soak.yaml --mode $$mode --events $(SOAK_EVENTS) --fail-apply-every $(SOAK_FAIL) \
			2> $(TEST_DIR)/kpsim-soak-$$mode.log; rc=$$?; \
		echo "soak $$mode: exit $$rc, $$(( $$(date +%s) - start )) s wall (progress in $(TEST_DIR)/kpsim-soak-$$mode.log)"; \
		[ $$rc = 0 ] || status=$$rc; \
	done; exit $$status

# import-fixtures regenerates the cluster dumps of scenarios/testdata/import/
# (kind-like and kubeadm-like) from a real kube-apiserver in a namespace of
# its own: the objects are written through the API and read back as
# kubectl get nodes,pods,svc,endpointslices -A -o yaml prints them (root,
# make upstream; about 20 s). Never edit the dumps by hand.
import-fixtures: bin/etcd bin/kube-apiserver
	@if [ "$$(id -u)" != 0 ]; then echo "make import-fixtures: needs root (it creates network namespaces)"; exit 3; fi
	flock /tmp/kpsim-heavy.lock $(GO) test -count=1 -run '^TestImportDumps$$' ./harness/upstream/ -update-import

# vm-assets prepares the qemu microVM of harness/vm: bin/sim to boot (static),
# qemu-system-x86 (installed when missing, and only when the VM will run:
# this kernel has no IPVS, or VM=1), and the Debian kernel (the package
# linux-image-amd64 depends on) and busybox-static, fetched into the cache
# with apt-get download and dpkg-deb -x (nothing else is installed). The
# kernel is fetched on every host: the Go test of the VM's module order runs
# on it. Idempotent: the cache is reused, apt-get update runs only when apt
# does not know the kernel package.
VM_BIN     := $(BIN)
VM_PACKAGE := qemu-system-x86
VM_NEEDED  := [ -n "$(VM)" ] || ! { [ -e /sys/module/ip_vs ] || [ -e /proc/net/ip_vs ]; }
vm-assets: deps sim
	@if [ "$$(id -u)" != 0 ]; then echo "make vm-assets: needs root (apt-get)"; exit 3; fi
	@if { $(VM_NEEDED); } && ! command -v qemu-system-x86_64 >/dev/null; then \
		echo "installing: $(VM_PACKAGE)"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(VM_PACKAGE) || exit 3; \
	fi
	@apt-cache show linux-image-amd64 >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get update -qq
	$(VM_BIN) vm fetch

# test-vm runs the IPVS conformance suite (scenarios/conformance/, which
# includes ipvs/) in IPVS mode. This host's kernel has no IPVS, so it runs in
# the microVM (vm-assets) booted with the static sim. On a kernel with IPVS
# (the Vagrant box) the suite runs directly; VM=1 forces the VM there too.
test-vm: vm-assets
	@if [ "$$(id -u)" != 0 ]; then echo "make test-vm: needs root (apt-get, network namespaces)"; exit 3; fi
	$(VM_BIN) conform scenarios/conformance/ --mode ipvs $(if $(VM),--vm) \
		--junit $(TEST_DIR)/kpsim-junit-ipvs.xml --summary $(TEST_DIR)/kpsim-summary-ipvs.md

# calibrate measures the host's modes for the simulator's cost model, with
# the commands that wrote results/calibration/ (its README lists them and
# what each took; about 1.5 hours on this 2-core machine, half of it
# iptables-nft at 3,000 and 5,000 Services). Root; each step under the
# heavy-run lock; jq joins the two ladders of iptables-large.json.
CAL      := results/calibration
CAL_TMP  := /tmp/kpsim-calibrate
CAL_LOCK := flock /tmp/kpsim-heavy.lock
calibrate: sim
	@command -v jq >/dev/null || { echo "make calibrate: needs jq (apt-get install jq)"; exit 3; }
	mkdir -p $(CAL_TMP)
	$(CAL_LOCK) $(BIN) calibrate --mode iptables --backend nft,legacy --sizes 100,250,500,1000,2000 --runs 3 --write $(CAL)/iptables.json
	$(CAL_LOCK) $(BIN) calibrate --mode iptables --backend legacy --sizes 5000,10000,30000 --runs 3 --write $(CAL_TMP)/legacy-large.json
	$(CAL_LOCK) $(BIN) calibrate --mode iptables --backend nft --sizes 3000,5000 --runs 1 --write $(CAL_TMP)/nft-large.json
	jq -s add $(CAL_TMP)/legacy-large.json $(CAL_TMP)/nft-large.json > $(CAL)/iptables-large.json
	$(CAL_LOCK) $(BIN) calibrate --mode nftables --layout kube-proxy,fast --sizes 100,250,500,1000,2000,5000 --runs 3 --write $(CAL)/nftables.json
	$(CAL_LOCK) $(BIN) calibrate --mode nftables --layout kube-proxy,fast --sizes 10000,20000,30000 --runs 3 --write $(CAL)/nftables-large.json
	$(CAL_LOCK) $(BIN) calibrate --mode nftables --layout kube-proxy,fast --endpoints 1 --sizes 1000,5000,10000,30000 --runs 3 --write $(CAL)/nftables-e1.json
	$(CAL_LOCK) $(BIN) calibrate --mode nftables --layout kube-proxy,fast --endpoints 50 --sizes 500,1000,2000,5000 --runs 3 --write $(CAL)/nftables-e50.json

# calibrate-ipvs measures IPVS mode in the microVM (this kernel has no IPVS;
# vm-assets) and the emulated CPU's slowdown: the same calibration (the
# nftables fast layout: one netlink transaction, linear on both sides) in the
# VM and on the host, whose ratio size by size the IPVS calibration records
# as its emulation (results/calibration/README.md, "IPVS"). The references go
# to results/calibration/emulation/ (not read as calibrations); the VM's
# reference stops at 5,000 Services (at 10,000 nft was killed in the 1 GB
# guest two minutes into a run bounded at 18: memory, presumably) and larger
# IPVS sizes take the ratio at 5,000.
# Each step takes the heavy lock by itself (root); about 25 minutes.
CAL_IPVS_SIZES  ?= 100,300,1000,2000,5000,10000
CAL_IPVS_LARGE  ?= 30000
CAL_REF_SIZES   ?= 100,300,1000,2000,5000
CAL_IPVS_RUNS   ?= 3
CAL_VM_TIMEOUT  ?= 100m
CAL_EMU         := $(CAL)/emulation
CAL_REFS         = --reference-vm $(CAL_EMU)/nftables-fast-vm.json --reference-host $(CAL_EMU)/nftables-fast-host.json
calibrate-ipvs: vm-assets
	mkdir -p $(CAL_EMU)
	$(CAL_LOCK) $(VM_BIN) calibrate --mode nftables --layout fast --vm --vm-timeout $(CAL_VM_TIMEOUT) --sizes $(CAL_REF_SIZES) --runs $(CAL_IPVS_RUNS) --write $(CAL_EMU)/nftables-fast-vm.json
	$(CAL_LOCK) $(VM_BIN) calibrate --mode nftables --layout fast --sizes $(CAL_REF_SIZES) --runs $(CAL_IPVS_RUNS) --write $(CAL_EMU)/nftables-fast-host.json
	$(CAL_LOCK) $(VM_BIN) calibrate --mode ipvs --vm --vm-timeout $(CAL_VM_TIMEOUT) --sizes $(CAL_IPVS_SIZES) --runs $(CAL_IPVS_RUNS) $(CAL_REFS) --write $(CAL)/ipvs.json
	$(CAL_LOCK) $(VM_BIN) calibrate --mode ipvs --vm --vm-timeout $(CAL_VM_TIMEOUT) --sizes $(CAL_IPVS_LARGE) --runs $(CAL_IPVS_RUNS) $(CAL_REFS) --write $(CAL)/ipvs-large.json

check-skips:
	@skips=$$(grep -E -- '--- SKIP' $(TEST_LOG) | wc -l); \
	if [ "$$(id -u)" = 0 ] && [ "$$skips" -gt 0 ]; then \
		echo "make test: $$skips test(s) skipped as root; every tier must run:"; grep -E -- '--- SKIP' -A2 $(TEST_LOG); exit 1; \
	fi; \
	pass=$$(grep -cE -- '^\s*--- PASS' $(TEST_LOG)); fail=$$(grep -cE -- '^\s*--- FAIL' $(TEST_LOG)); \
	echo "$$pass passed, $$fail failed, $$skips skipped"

# Fuzz targets (package:target:count), each with its seed corpus under the
# package's testdata/fuzz/TARGET/ (go test runs the corpus as ordinary tests
# too: make test's go test -race runs every committed input). make fuzz runs
# each for FUZZTIME; make fuzz-short runs each for its count of executions, at
# most about 20 s of this 2-core machine's rate for that target (measured:
# from about 100/s for the scenario loader to 50,000/s for the tokenizer).
# make test does not fuzz: a fresh machine spent 360 s executing and 550 s
# compiling the instrumented packages, a quarter of make test's 45-minute
# budget, for a few seconds of new inputs per target. A count, not a
# duration: with a duration, Go 1.26's fuzz coordinator can report
# "context deadline exceeded" as a failure when the time runs out while a
# worker is mid-call (golang/go#75804, fixed in Go 1.27), a failure with no
# input behind it. go test -fuzz takes one target
# per run. A crasher is written into the corpus; commit it with the fix.
FUZZ_TARGETS := \
	sim/scenario:FuzzLoad:2000 sim/scenario:FuzzImport:1500 \
	dataplane/iptables:FuzzParseCounters:1600 dataplane/iptables:FuzzFakeRestore:6000 \
	dataplane/restore:FuzzTokenize:500000 \
	dataplane/nftables:FuzzParseCountersJSON:2000 dataplane/nftables:FuzzParseCountersText:30000 \
	dataplane/nftables:FuzzParseCountersDump:20000 \
	harness/diagnose:FuzzReadNFT:1800 harness/diagnose:FuzzReadNFTJSON:3000 \
	dataplane/ipvs:FuzzParseStatsPerCPU:50000 dataplane/ipvs:FuzzCanonicalSets:8000 dataplane/ipvs:FuzzKubeRules:30000 \
	harness/traffic:FuzzParseArrival:250000 harness/traffic:FuzzParseUnreachable:300000 \
	harness/diagnose:FuzzAnalyze:10000 \
	harness/diagnose:FuzzReadIPTablesSave:2800 \
	harness/diagnose:FuzzReadIPVSAdm:20000
FUZZTIME       ?= 10m
# Minimising a new input runs the target many times; Go's default (60 s per
# input) would dwarf a short run.
FUZZMINIMIZETIME ?= 5s

fuzz:
	@$(MAKE) --no-print-directory fuzz-run FUZZ_FOR=$(FUZZTIME)

# fuzz-short: FUZZ_FOR empty, so each target runs for its count.
fuzz-short:
	@$(MAKE) --no-print-directory fuzz-run FUZZ_FOR=

fuzz-run:
	@set -o pipefail; for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; rest=$${t#*:}; fn=$${rest%%:*}; \
		budget=$(FUZZ_FOR); budget=$${budget:-$${rest##*:}x}; \
		echo "fuzz $$fn (./$$pkg) for $$budget"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $$budget -fuzzminimizetime $(FUZZMINIMIZETIME) ./$$pkg 2>&1 \
			| grep -v '^fuzz: elapsed: [0-9]*s, execs' || { echo "make fuzz: $$fn failed (the crasher is in $$pkg/testdata/fuzz/$$fn/)"; exit 1; }; \
	done

# diagnose-testdata-nft regenerates the nftables reader's test inputs,
# harness/diagnose/testdata/nft/ (root, nft, unshare): our rules for
# harness/diagnose/testdata/nft-scenario.yaml (correct, uniform-probability,
# skew-at-mde) loaded by the real nft into a throwaway network namespace,
# with affinity set elements and other tables added, read back with `nft
# list ruleset`, `nft -j list ruleset` and `nft list table ip kube-proxy`.
diagnose-testdata-nft: sim
	flock /tmp/kpsim-heavy.lock sh harness/diagnose/testdata/gen-nft.sh $(BIN) harness/diagnose/testdata/nft

# diagnose-testdata regenerates sim diagnose's dumps from a real kernel (root,
# namespaces): harness/diagnose/testdata/iptables/*.save, our iptables rules
# loaded with both iptables backends, real connections from a client pod,
# then iptables-<variant>-save -c. Never hand-edit them; review the diff.
diagnose-testdata:
	flock /tmp/kpsim-heavy.lock $(GO) test -count=1 -run '^TestIPTablesReadBack$$' ./harness/diagnose/ -update

bench:
	$(GO) test -run XXX -bench . -benchtime 3x -count 5 ./sim/apiserver/
	$(GO) test -run XXX -bench . -count 5 ./harness/stats/

lint:
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# capacity-results regenerates the model side of results/capacity/README.md's
# comparison with published figures: sim capacity's JSON (and its table, the
# figures as sim capacity prints them) for each shape the rows need, and
# results/capacity/model.md from the JSON (model-columns.sh, jq; exit 3 when
# jq is missing: install the Debian package jq). No root, a few seconds each.
# The table's last line (sweep wall time, on stdout) is dropped: same seed,
# same bytes.
CAPACITY_RUNS = \
	capacity:scenarios/1000-services.yaml:100,1000,5000,10000,30000 \
	clusterip-10:results/capacity/scenarios/clusterip-10.yaml:100,1000,5000,10000,30000 \
	clusterip-50:results/capacity/scenarios/clusterip-50.yaml:5006 \
	clusterip-1:results/capacity/scenarios/clusterip-1.yaml:44125 \
	clusterip-2:results/capacity/scenarios/clusterip-2.yaml:44125
capacity-results: sim
	@command -v jq >/dev/null || { echo "capacity-results: jq is missing (Debian package jq)" >&2; exit 3; }
	set -eo pipefail; for r in $(CAPACITY_RUNS); do \
		name=$${r%%:*}; rest=$${r#*:}; file=$${rest%%:*}; sizes=$${rest#*:}; \
		$(BIN) capacity $$file --sizes $$sizes --progress never -o json > results/capacity/$$name.json; \
		$(BIN) capacity $$file --sizes $$sizes --progress never -o table > results/capacity/$$name.txt; \
	done
	sh results/capacity/model-columns.sh $(foreach r,$(CAPACITY_RUNS),results/capacity/$(firstword $(subst :, ,$(r))).json) > results/capacity/model.md

# results regenerates results/1000-services/ with the tool: report.json (the
# same seed gives the same bytes), report.md and the PNG plots. Never edit
# them by hand; the run fails (exit 1) if a scenario check fails.
results: sim
	rm -f results/1000-services/cluster.json
	$(BIN) run scenarios/1000-services.yaml --out results/1000-services

fresh-check:
	bash .ci/fresh-check

clean:
	rm -rf bin
