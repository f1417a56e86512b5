#!/bin/sh
# gen-conntrack.sh [OUTDIR]: the conntrack fixtures of sim diagnose, from a
# real kernel (root). It programs ../iptables/overall.nft.save (kube-proxy's
# iptables-mode rules for one node: cluster IPs 172.30.0.41-52, endpoints
# 10.180.x.x, external IPs, load-balancer IPs, node ports, a UDP Service)
# into a node namespace with iptables-nft-restore, sends traffic through it
# from a pod-range client and an outside client to endpoint pods behind it,
# and captures the node's conntrack table. MODE=nftables does the same with
# ../nft/overall.nft (the nftables layout of the same Services, loaded with
# nft -f; its node ports answer on 192.168.0.2, its nodeport-ips).
#
# Namespaces (all created here, all removed on exit; nothing else is
# touched, no packet leaves them):
#
#   kpsimctfx-client 10.0.5.2 ──┐                       ┌── kpsimctfx-pods
#   (a pod-range client)        ├── kpsimctfx-node ─────┤   10.180.255.2/16 and every
#   kpsimctfx-ext 203.0.113.5 ──┘   10.0.5.1, 203.0.113.1,  endpoint address /32
#   (outside, in the LB's           10.180.255.1; the dump's   (servers on tcp 80, 8080,
#    source range)                  rules, ip_forward         udp 53)
#
# Two stages, as a node lives through Service changes:
#
#   A  the dump's rules with three differences kube-proxy later undid:
#      ns2/svc2:p80 had two endpoints (10.180.0.4, 10.180.0.5; 10.180.1.7
#      came with a scale-up), ns1/svc1:p80 had a second endpoint
#      10.180.0.2:80 and ns8/svc8:dns a second endpoint 10.180.0.12:53
#      (10.180.0.14 replaced it). 60 long-lived connections to svc2, 10 to
#      svc1, 16 UDP flows to svc8 that keep sending.
#   B  the dump's rules exactly (iptables-nft-restore of the whole file);
#      the pods 10.180.0.2 and 10.180.0.12 are deleted (their addresses
#      removed). New traffic: see below. The stage-A connections keep their
#      conntrack entries: svc2's pin the two old endpoints, svc1's and
#      svc8's point at deleted pods (stale; svc8's UDP flows are the
#      black hole kube-proxy's conntrack cleanup exists for).
#
# Outputs (OUTDIR, default this folder); MODE=nftables writes
# nftables.conntrack (conntrack -L > FILE 2>&1) and nftables-node.nft (nft
# list ruleset at the capture) instead:
#   overall.conntrack           conntrack -L > FILE 2>&1 (the count line on stderr included)
#   overall-extended.conntrack  conntrack -L -o extended,id (stdout only)
#   overall-node.nft.save       iptables-nft-save -c of the node at the capture
#   forms.conntrack             conntrack -L -o extended,id,ktimestamp > FILE 2>&1 of a namespace
#                               (kpsimctfx-forms) whose entries conntrack -I inserted, with
#                               accounting and timestamps on: zone=, mark=, packets= bytes=,
#                               delta-time=, [start=...], SCTP, IPv6, ICMP, [UNREPLIED]
#   forms.proc                  /proc/net/nf_conntrack of that namespace
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
mode=${MODE:-iptables}
case $mode in
iptables) dump=$here/../iptables/overall.nft.save nodeport=203.0.113.1 ;;
nftables) dump=$here/../nft/overall.nft nodeport=192.168.0.2 ;;
*) echo "MODE=$mode: want iptables or nftables" >&2; exit 2 ;;
esac
P=kpsimctfx
NODE=$P-node CLIENT=$P-client EXT=$P-ext PODS=$P-pods FORMS=$P-forms
tmp=$(mktemp -d)
pids=""
cleanup() {
	for p in $pids; do kill "$p" 2>/dev/null || true; done
	for p in $pids; do wait "$p" 2>/dev/null || true; done
	for ns in $NODE $CLIENT $EXT $PODS $FORMS; do ip netns del "$ns" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
for ns in $NODE $CLIENT $EXT $PODS $FORMS; do
	if ip netns list | grep -q "^$ns\b"; then
		echo "namespace $ns exists: a run is going on, or remove it with ip netns del $ns" >&2
		exit 1
	fi
done
(cd "$here/ctgen" && go build -o "$tmp/ctgen" .)
ctgen=$tmp/ctgen
nsx() { ns=$1; shift; ip netns exec "$ns" "$@"; }

# Background a command in a namespace and wait until it wrote its ready file.
bg() {
	ns=$1 name=$2 sub=$3; shift 3
	# ip netns exec execs the command: $! is ctgen's own pid.
	ip netns exec "$ns" "$ctgen" "$sub" -ready "$tmp/$name.ready" "$@" &
	pids="$pids $!"
	i=0
	while [ ! -e "$tmp/$name.ready" ]; do
		i=$((i + 1))
		[ $i -le 300 ] || { echo "$name did not get ready" >&2; exit 1; }
		sleep 0.1
	done
}

for ns in $NODE $CLIENT $EXT $PODS; do ip netns add "$ns"; nsx "$ns" ip link set lo up; done
ip link add nc0 netns $NODE type veth peer name c0 netns $CLIENT
ip link add ne0 netns $NODE type veth peer name e0 netns $EXT
ip link add np0 netns $NODE type veth peer name p0 netns $PODS
nsx $NODE ip addr add 10.0.5.1/24 dev nc0
nsx $NODE ip addr add 203.0.113.1/25 dev ne0
[ $nodeport = 203.0.113.1 ] || nsx $NODE ip addr add $nodeport/32 dev ne0
nsx $NODE ip addr add 10.180.255.1/16 dev np0
nsx $CLIENT ip addr add 10.0.5.2/24 dev c0
nsx $EXT ip addr add 203.0.113.5/25 dev e0
nsx $PODS ip addr add 10.180.255.2/16 dev p0
for a in 10.180.0.1 10.180.0.2 10.180.0.3 10.180.0.4 10.180.0.5 10.180.0.8 10.180.0.11 10.180.0.12 \
	10.180.0.13 10.180.0.14 10.180.0.15 10.180.0.16 10.180.0.17 10.180.0.18 10.180.0.19 10.180.0.20 \
	10.180.1.7 10.180.2.3; do
	nsx $PODS ip addr add $a/32 dev p0
done
nsx $NODE ip link set nc0 up
nsx $NODE ip link set ne0 up
nsx $NODE ip link set np0 up
nsx $CLIENT ip link set c0 up
nsx $EXT ip link set e0 up
nsx $PODS ip link set p0 up
nsx $CLIENT ip route add default via 10.0.5.1
nsx $EXT ip route add default via 203.0.113.1
nsx $PODS ip route add default via 10.180.255.1
nsx $NODE sysctl -qw net.ipv4.ip_forward=1

ip netns exec $PODS "$ctgen" serve -tcp 80,8080 -udp 53 &
pids="$pids $!"
sleep 0.5

# The rules, then stage A's changes to them.
if [ $mode = iptables ]; then
	# The nfacct counters the dump's rules match (kube-proxy creates them).
	nsx $NODE "$ctgen" nfacct ct_state_invalid_dropped_pkts localhost_nps_accepted_pkts
	nsx $NODE iptables-nft-restore < "$dump"

	# Stage A.
	nsx $NODE iptables-nft-restore --noflush <<'EOF'
*nat
:KUBE-SVC-GNZBNJ2PO5MGZ6GT - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SVC-YE4MPDANQKAMNBTV - [0:0]
:KUBE-SEP-STALETCPCTFX0002 - [0:0]
:KUBE-SEP-STALEUDPCTFX0012 - [0:0]
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT ! -s 10.0.0.0/8 -d 172.30.0.42/32 -p tcp -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.4:80" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-G33XYM2U7DNPVRY2
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.5:80" -j KUBE-SEP-73XYSGBP6YVLYPDR
-A KUBE-SVC-XPGD46QRK7WJZT7O ! -s 10.0.0.0/8 -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-SXIVWICOYRO3J4NJ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.2:80" -j KUBE-SEP-STALETCPCTFX0002
-A KUBE-SEP-STALETCPCTFX0002 -s 10.180.0.2/32 -m comment --comment "ns1/svc1:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-STALETCPCTFX0002 -p tcp -m comment --comment "ns1/svc1:p80" -m tcp -j DNAT --to-destination 10.180.0.2:80
-A KUBE-SVC-YE4MPDANQKAMNBTV ! -s 10.0.0.0/8 -d 172.30.0.48/32 -p udp -m comment --comment "ns8/svc8:dns cluster IP" -m udp --dport 53 -j KUBE-MARK-MASQ
-A KUBE-SVC-YE4MPDANQKAMNBTV -m comment --comment "ns8/svc8:dns -> 10.180.0.12:53" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-STALEUDPCTFX0012
-A KUBE-SVC-YE4MPDANQKAMNBTV -m comment --comment "ns8/svc8:dns -> 10.180.0.13:53" -j KUBE-SEP-N3C2QP55VRVS7PK5
-A KUBE-SEP-STALEUDPCTFX0012 -s 10.180.0.12/32 -m comment --comment "ns8/svc8:dns" -j KUBE-MARK-MASQ
-A KUBE-SEP-STALEUDPCTFX0012 -p udp -m comment --comment "ns8/svc8:dns" -m udp -j DNAT --to-destination 10.180.0.12:53
COMMIT
EOF
else
	nsx $NODE nft -f "$dump"
	nsx $NODE nft -f - <<'EOF'
flush chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.180.0.4 . 80, 1 : 10.180.0.5 . 80 }
flush chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.180.0.1 . 80, 1 : 10.180.0.2 . 80 }
flush chain ip kube-proxy service-RGZ7CTAF-ns8/svc8/udp/dns
add rule ip kube-proxy service-RGZ7CTAF-ns8/svc8/udp/dns meta l4proto udp dnat ip to numgen random mod 2 map { 0 : 10.180.0.12 . 53, 1 : 10.180.0.13 . 53 }
EOF
fi
bg $CLIENT a-svc2 tcp -n 60 -hold 172.30.0.42:80
bg $CLIENT a-svc1 tcp -n 10 -hold 172.30.0.41:80
bg $CLIENT a-svc8 udp -n 16 -keep 172.30.0.48:53

# Stage B: the dump's rules; the pods 10.180.0.2 and 10.180.0.12 deleted.
if [ $mode = iptables ]; then
	nsx $NODE iptables-nft-restore < "$dump"
else
	printf 'flush ruleset\ninclude "%s"\n' "$dump" | nsx $NODE nft -f -
fi
nsx $PODS ip addr del 10.180.0.2/32 dev p0
nsx $PODS ip addr del 10.180.0.12/32 dev p0
bg $CLIENT b-svc2 tcp -n 30 -hold 172.30.0.42:80
nsx $CLIENT "$ctgen" tcp -n 30 172.30.0.42:80
bg $CLIENT b-svc10 tcp -n 40 -hold 172.30.0.50:80
bg $CLIENT b-svc10-ext tcp -n 10 -hold 192.168.99.10:80
bg $EXT b-svc10-np tcp -n 10 -hold $nodeport:30010
bg $EXT b-svc10-lb tcp -n 6 -hold 1.2.3.10:80
bg $CLIENT b-svc11 tcp -n 10 -hold 172.30.0.51:80
bg $EXT b-svc11-lb tcp -n 5 -hold 5.6.7.11:80
bg $EXT b-svc9-np tcp -n 5 -hold $nodeport:30080
bg $CLIENT b-svc3 tcp -n 5 -hold 172.30.0.43:80
bg $CLIENT b-svc7 tcp -n 5 -hold 172.30.0.47:80
bg $CLIENT b-svc4 tcp -n 5 -hold 172.30.0.44:80
nsx $CLIENT "$ctgen" udp -n 20 172.30.0.48:53
nsx $EXT "$ctgen" udp -n 5 $nodeport:30053
# Not a Service: a pod reached directly, an address nobody answers, ICMP.
bg $CLIENT b-direct tcp -n 3 -hold 10.180.0.1:80
nsx $CLIENT "$ctgen" udp -n 2 -unanswered 10.180.0.99:53
nsx $CLIENT "$ctgen" ping -n 2 10.180.0.1
sleep 2

if [ $mode = nftables ]; then
	nsx $NODE conntrack -L > "$out/nftables.conntrack" 2>&1
	nsx $NODE nft list ruleset > "$out/nftables-node.nft"
	echo "wrote $out/nftables.conntrack ($(grep -c 'src=' "$out/nftables.conntrack") entries), nftables-node.nft"
	exit 0
fi
nsx $NODE conntrack -L > "$out/overall.conntrack" 2>&1
nsx $NODE conntrack -L -o extended,id > "$out/overall-extended.conntrack" 2>/dev/null
nsx $NODE iptables-nft-save -c > "$out/overall-node.nft.save"
# The output forms: entries inserted with conntrack -I (no traffic).
ip netns add $FORMS
nsx $FORMS sysctl -qw net.netfilter.nf_conntrack_acct=1
nsx $FORMS sysctl -qw net.netfilter.nf_conntrack_timestamp=1
nsx $FORMS sh -e 2>/dev/null <<'EOF'
conntrack -I -p tcp -s 10.0.5.2 -d 172.30.0.42 --sport 40000 --dport 80 -r 10.180.0.4 -q 10.0.5.2 --reply-port-src 80 --reply-port-dst 40000 --state ESTABLISHED -t 431999 -u ASSURED --zone 7 -m 16384
conntrack -I -p udp -s 10.0.5.2 -d 172.30.0.48 --sport 5353 --dport 53 -r 10.180.0.13 -q 10.0.5.2 --reply-port-src 53 --reply-port-dst 5353 -t 29
conntrack -I -p sctp -s 10.0.5.2 -d 172.30.0.60 --sport 3000 --dport 3868 -r 10.180.0.30 -q 10.0.5.2 --reply-port-src 3868 --reply-port-dst 3000 --state ESTABLISHED -t 100 --orig-vtag 1 --reply-vtag 2
conntrack -I -p tcp -s fd00::2 -d fd00:96::10 --sport 40001 --dport 80 -r fd00:180::4 -q fd00::2 --reply-port-src 80 --reply-port-dst 40001 --state TIME_WAIT -t 60
conntrack -I -p icmp -s 10.0.5.2 -d 10.180.0.1 -r 10.180.0.1 -q 10.0.5.2 --icmp-type 8 --icmp-code 0 --icmp-id 77 -t 20
EOF
nsx $FORMS conntrack -L -o extended,id,ktimestamp > "$out/forms.conntrack" 2>&1
nsx $FORMS cat /proc/net/nf_conntrack > "$out/forms.proc"

echo "wrote $out/overall.conntrack ($(grep -c 'src=' "$out/overall.conntrack") entries), overall-extended.conntrack, overall-node.nft.save, forms.conntrack, forms.proc"
