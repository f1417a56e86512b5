#!/bin/sh
# test-cluster.sh (make test-cluster; root): issue 32's proof on a real local
# cluster. For each kube-proxy mode (iptables, nftables) it brings up a
# three-node cluster (sim cluster up: the unmodified kube-proxy), runs the
# conformance suite on it with --kubeconfig (must exit 0), tears it down, and
# compares the verdicts with the namespace run of the same scenarios against
# the same kube-proxy (sim conform --subject kube-proxy): every check made in
# both must have the same verdict. Then it runs kpsim's dataplane as the
# node proxy (sim cluster up --node-proxy kpsim): the distribution scenario
# passes without a fault and fails (exit 1) under --proxy-fault
# uniform-probability. The host is snapshotted before and after
# (host-snapshot.sh) and must be unchanged. Reports and logs go to $OUT.
#
# SKIP_NAMESPACE_RUN=1 leaves out the namespace runs and the comparison.
set -u
cd "$(dirname "$0")/../.."
SIM=$(pwd)/bin/sim
OUT=${OUT:-/tmp/kpsim-test-cluster}
NODES=node-a,node-b,node-c
fail=0
rm -rf "$OUT"
mkdir -p "$OUT"
say() { printf '%s test-cluster: %s\n' "$(date +%T)" "$*"; }
bad() { say "FAIL: $*"; fail=1; }

sh harness/cluster/host-snapshot.sh "$OUT/host-before.txt"
start=$(date +%s)

# up NAME FLAGS...: brings a cluster up, its kubeconfig at $OUT/NAME.kubeconfig;
# sets RUN to its run ID.
up() {
	name=$1; shift
	RUN=$("$SIM" cluster up --nodes "$NODES" --kubeconfig "$OUT/$name.kubeconfig" "$@" 2>"$OUT/$name-up.err" | sed -n 's/^run: //p')
	if [ -z "$RUN" ]; then
		bad "$name: sim cluster up failed:"; cat "$OUT/$name-up.err"; return 1
	fi
	say "$name: cluster $RUN up"
}
down() {
	"$SIM" cluster down "$RUN" >"$OUT/$1-down.txt" 2>&1 || bad "$1: sim cluster down $RUN failed: $(cat "$OUT/$1-down.txt")"
}
# conform NAME WANT-EXIT ARGS...: sim conform on the current cluster.
conform() {
	name=$1 want=$2; shift 2
	t0=$(date +%s)
	"$SIM" conform --kubeconfig "$OUT/${name%%-*}.kubeconfig" --json "$OUT/$name.json" --junit "$OUT/$name.xml" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.log"
	got=$?
	say "$name: exit $got (want $want) in $(( $(date +%s) - t0 )) s; $(tail -1 "$OUT/$name.txt")"
	[ "$got" = "$want" ] || { bad "$name: exit $got, want $want"; tail -30 "$OUT/$name.txt"; }
}

for mode in iptables nftables; do
	if up "$mode" --proxy-mode "$mode"; then
		conform "$mode-cluster" 0 scenarios/conformance/ --mode "$mode"
		down "$mode"
	fi
	if [ "${SKIP_NAMESPACE_RUN:-}" != 1 ]; then
		t0=$(date +%s)
		"$SIM" conform scenarios/conformance/ --subject kube-proxy --mode "$mode" --json "$OUT/$mode-namespaces.json" >"$OUT/$mode-namespaces.txt" 2>"$OUT/$mode-namespaces.log"
		say "$mode-namespaces: exit $? in $(( $(date +%s) - t0 )) s; $(tail -1 "$OUT/$mode-namespaces.txt")"
		KPSIM_VERDICTS_A="$OUT/$mode-cluster.json" KPSIM_VERDICTS_B="$OUT/$mode-namespaces.json" \
			go test -tags clustertest -count=1 -v -run TestSameVerdicts ./harness/cluster/ >"$OUT/$mode-compare.txt" 2>&1 \
			|| { bad "$mode: the cluster's verdicts differ from the namespace run's"; cat "$OUT/$mode-compare.txt"; }
		grep -h 'same verdict' "$OUT/$mode-compare.txt" || true
	fi
done

if up kpsim --proxy-mode iptables --node-proxy kpsim; then
	conform kpsim-correct 0 scenarios/conformance/distribution.yaml --mode iptables
	down kpsim
fi
if up kpsim --proxy-mode iptables --node-proxy kpsim --proxy-fault uniform-probability; then
	conform kpsim-fault 1 scenarios/conformance/distribution.yaml --mode iptables
	down kpsim
fi

sh harness/cluster/host-snapshot.sh "$OUT/host-after.txt"
if ! diff -u "$OUT/host-before.txt" "$OUT/host-after.txt" >"$OUT/host-diff.txt"; then
	bad "the host changed:"; cat "$OUT/host-diff.txt"
fi
say "done in $(( $(date +%s) - start )) s: $( [ $fail = 0 ] && echo PASS || echo FAIL ) (reports in $OUT)"
exit $fail
