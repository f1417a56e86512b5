#!/bin/sh
# gen-external.sh SIM [OUT]: regenerate sim diagnose's external-path
# fixtures (root; network namespaces that sim conform creates and removes;
# nothing on the host changes). One `sim conform --dump` run of
# external.yaml per archive, SUBJECT-MODE-CASE.tar.gz: SUBJECT kpsim (this
# repository's dataplane) or kube-proxy (bin/kube-proxy v1.37.2 beside SIM,
# with kube-apiserver and etcd, as sim conform --subject kube-proxy runs
# it), MODE iptables (nft backend) or nftables (kube-proxy's layout), CASE
# correct or a named fault of our dataplane (--fault CASE); IPVS mode
# (kpsim-ipvs-correct) runs in the qemu microVM of harness/vm when this
# kernel has no IPVS (make vm-assets first; about 80 s under TCG here),
# skipped with SKIP_IPVS=1. The kube-proxy subject has no IPVS run (sim
# conform runs it in iptables and nftables modes only). A fault run
# exits 1 (a check fails); any other exit but 0 stops the script. The
# archive holds the dump folder as sim conform wrote it (manifest.json at
# its top; harness/README.md "Dumps"), packed as make diagnose-dumps packs
# its own. Run it under the heavy lock:
#   flock /tmp/kpsim-heavy.lock sh harness/diagnose/testdata/external/gen-external.sh bin/sim
set -u
sim=${1:?usage: gen-external.sh SIM [OUT]}
here=$(cd "$(dirname "$0")" && pwd)
out=${2:-$here}
[ "$(id -u)" = 0 ] || { echo "gen-external.sh: needs root (network namespaces)"; exit 3; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out" || exit 1
one() { # NAME FLAGS...
	name=$1; shift
	d=$tmp/$name; t0=$(date +%s)
	timeout 2400 "$sim" conform "$@" --dump "$d" "$here/external.yaml" >"$d.log" 2>&1
	rc=$?
	if [ $rc -gt 1 ] || [ ! -f "$d/manifest.json" ]; then
		echo "gen-external.sh: $name: sim conform exited $rc"; tail -20 "$d.log"; return 1
	fi
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$d" -cf - . | gzip -9n >"$out/$name.tar.gz" || return 1
	echo "gen-external.sh: $name: exit $rc, $(( $(date +%s) - t0 )) s, $(wc -c <"$out/$name.tar.gz") bytes"
}
one kpsim-iptables-correct --mode iptables --iptables-backend nft || exit 1
one kpsim-iptables-uniform-probability --mode iptables --iptables-backend nft --fault uniform-probability || exit 1
one kpsim-nftables-correct --mode nftables --layout kube-proxy || exit 1
one kpsim-nftables-uniform-probability --mode nftables --layout kube-proxy --fault uniform-probability || exit 1
one kube-proxy-iptables-correct --subject kube-proxy --mode iptables || exit 1
one kube-proxy-nftables-correct --subject kube-proxy --mode nftables || exit 1
[ "${SKIP_IPVS:-}" = 1 ] || one kpsim-ipvs-correct --mode ipvs || exit 1
