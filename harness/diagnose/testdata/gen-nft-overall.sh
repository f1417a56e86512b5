#!/bin/sh
# gen-nft-overall.sh [OUTDIR]: nft/overall.nft, the nftables read-back with
# external IPs, load-balancer IPs and node ports (root). It loads the
# nftables backend's kube-proxy-layout golden for dataplanetest's overall
# state (../../../dataplane/nftables/testdata/overall-kube-proxy-dump.golden:
# the Services of iptables/overall.*.save, cluster IPs 172.30.0.41-53) with
# the real nft into a network namespace of its own (kpsimctfx-nft, removed
# on exit) and prints `nft list ruleset`. Never edit the output by hand.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/nft}
ns=kpsimctfx-nft
trap 'ip netns del $ns 2>/dev/null || true' EXIT INT TERM
ip netns add $ns
ip netns exec $ns nft -f "$here/../../../dataplane/nftables/testdata/overall-kube-proxy-dump.golden"
ip netns exec $ns nft list ruleset > "$out/overall.nft"
echo "wrote $out/overall.nft"
