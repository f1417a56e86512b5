#!/bin/sh
# gen-nft.sh SIM OUTDIR: the nftables reader's read-backs (make
# diagnose-testdata-nft, root). For each variant (the correct rules and two
# named faults) it renders nft-scenario.yaml's node-a with `sim rules --mode
# nftables`, loads it with the real nft into a throwaway network namespace
# (unshare --net: nothing outside it is touched), adds what a real node has
# besides (affinity set elements, as traffic would leave them; other
# tables: a firewall, iptables-nft's nat table, kube-proxy's ip6 table) and
# reads everything back with `nft list ruleset` and `nft -j list ruleset`.
# The outputs are committed; never edit them by hand.
set -eu
sim=$1
out=$2
here=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for variant in fair uniform-probability skew-at-mde; do
	fault=""
	[ "$variant" = fair ] || fault="--fault $variant"
	# shellcheck disable=SC2086
	"$sim" rules "$here/nft-scenario.yaml" --mode nftables --node node-a $fault > "$tmp/rules.nft"
	: > "$tmp/extra.nft"
	if [ "$variant" = fair ]; then
		# Clients remembered by the affinity sets (one with a timeout of
		# its own), and the tables of other software on the node.
		sets=$(sed -n 's/^add set ip kube-proxy \(affinity-[^ ]*\) .*/\1/p' "$tmp/rules.nft")
		set -- $sets
		cat > "$tmp/extra.nft" <<NFT
add element ip kube-proxy $1 { 10.244.0.200, 10.244.0.201 }
add element ip kube-proxy $2 { 10.244.1.200 timeout 1h }
add table inet filter
add chain inet filter input { type filter hook input priority 0 ; policy accept ; }
add rule inet filter input ct state established,related accept
add rule inet filter input tcp dport 22 accept
add table ip nat
add chain ip nat POSTROUTING { type nat hook postrouting priority 100 ; policy accept ; }
add chain ip nat DOCKER
add rule ip nat POSTROUTING ip saddr 172.17.0.0/16 oifname != "docker0" counter masquerade
add rule ip nat DOCKER iifname "docker0" counter return
add table ip6 kube-proxy
add chain ip6 kube-proxy services
add rule ip6 kube-proxy services ip6 daddr fd00::1 drop
NFT
	fi
	unshare --net sh -c "set -e; nft -f '$tmp/rules.nft'; nft -f '$tmp/extra.nft'; \
		nft list ruleset > '$out/$variant.nft'; nft -j list ruleset > '$out/$variant.json'; \
		nft list table ip kube-proxy > '$out/$variant-table.nft'"
	echo "wrote $out/$variant.nft, $variant.json, $variant-table.nft"
done
