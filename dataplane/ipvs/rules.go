package ipvs

// kube-proxy's ipsets and its constant iptables rules in IPVS mode
// (pkg/proxy/ipvs/proxier.go writeIptablesRules, ipsetInfo,
// ipsetWithIptablesChain, iptablesJumpChain). The rule count does not grow
// with the number of Services: per-service state lives in the ipsets.

import (
	"fmt"
	"strings"

	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/proxy"
)

// The ipsets, by kube-proxy's names.
const (
	SetLoopBack             = "KUBE-LOOP-BACK"
	SetClusterIP            = "KUBE-CLUSTER-IP"
	SetExternalIP           = "KUBE-EXTERNAL-IP"
	SetExternalIPLocal      = "KUBE-EXTERNAL-IP-LOCAL"
	SetLoadBalancer         = "KUBE-LOAD-BALANCER"
	SetLoadBalancerFW       = "KUBE-LOAD-BALANCER-FW"
	SetLoadBalancerLocal    = "KUBE-LOAD-BALANCER-LOCAL"
	SetLoadBalancerSourceIP = "KUBE-LOAD-BALANCER-SOURCE-IP"
	SetLoadBalancerSourceCI = "KUBE-LOAD-BALANCER-SOURCE-CIDR"
	SetNodePortTCP          = "KUBE-NODE-PORT-TCP"
	SetNodePortLocalTCP     = "KUBE-NODE-PORT-LOCAL-TCP"
	SetNodePortUDP          = "KUBE-NODE-PORT-UDP"
	SetNodePortLocalUDP     = "KUBE-NODE-PORT-LOCAL-UDP"
	SetNodePortSCTP         = "KUBE-NODE-PORT-SCTP-HASH"
	SetNodePortLocalSCTP    = "KUBE-NODE-PORT-LOCAL-SCTP-HASH"
	SetHealthCheckNodePort  = "KUBE-HEALTH-CHECK-NODE-PORT"
	SetIPVSIPs              = "KUBE-IPVS-IPS"
)

// The chains, by kube-proxy's names.
const (
	ChainServices          = "KUBE-SERVICES"
	ChainPostrouting       = "KUBE-POSTROUTING"
	ChainNodePort          = "KUBE-NODE-PORT"
	ChainLoadBalancer      = "KUBE-LOAD-BALANCER"
	ChainMarkMasq          = "KUBE-MARK-MASQ"
	ChainForward           = "KUBE-FORWARD"
	ChainProxyFirewall     = "KUBE-PROXY-FIREWALL"
	ChainSourceRangesFW    = "KUBE-SOURCE-RANGES-FIREWALL"
	ChainIPVSFilter        = "KUBE-IPVS-FILTER"
	ChainIPVSOutFilter     = "KUBE-IPVS-OUT-FILTER"
	tableNAT, tableFilter  = "nat", "filter"
	hashFamily, hashSize   = "inet", 1024
	maxElem, bitmapPortMax = 65536, "0-65535"
)

type ipsetInfo struct {
	name, typ, comment string
}

// ipsets is kube-proxy's ipsetInfo: every set it creates, in its order.
var ipsets = []ipsetInfo{
	{SetLoopBack, "hash:ip,port,ip", "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"},
	{SetClusterIP, "hash:ip,port", "Kubernetes service cluster ip + port for masquerade purpose"},
	{SetExternalIP, "hash:ip,port", "Kubernetes service external ip + port for masquerade and filter purpose"},
	{SetExternalIPLocal, "hash:ip,port", "Kubernetes service external ip + port with externalTrafficPolicy=local"},
	{SetLoadBalancer, "hash:ip,port", "Kubernetes service lb portal"},
	{SetLoadBalancerFW, "hash:ip,port", "Kubernetes service load balancer ip + port for load balancer with sourceRange"},
	{SetLoadBalancerLocal, "hash:ip,port", "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"},
	{SetLoadBalancerSourceIP, "hash:ip,port,ip", "Kubernetes service load balancer ip + port + source IP for packet filter purpose"},
	{SetLoadBalancerSourceCI, "hash:ip,port,net", "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"},
	{SetNodePortTCP, "bitmap:port", "Kubernetes nodeport TCP port for masquerade purpose"},
	{SetNodePortLocalTCP, "bitmap:port", "Kubernetes nodeport TCP port with externalTrafficPolicy=local"},
	{SetNodePortUDP, "bitmap:port", "Kubernetes nodeport UDP port for masquerade purpose"},
	{SetNodePortLocalUDP, "bitmap:port", "Kubernetes nodeport UDP port with externalTrafficPolicy=local"},
	{SetNodePortSCTP, "hash:ip,port", "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"},
	{SetNodePortLocalSCTP, "hash:ip,port", "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"},
	{SetHealthCheckNodePort, "bitmap:port", "Kubernetes health check node port"},
	{SetIPVSIPs, "hash:ip", "Addresses on the ipvs interface"},
}

// SetNames lists every ipset the backend creates, in kube-proxy's order.
func SetNames() []string {
	out := make([]string, len(ipsets))
	for i, s := range ipsets {
		out[i] = s.name
	}
	return out
}

func setInfo(name string) ipsetInfo {
	for _, s := range ipsets {
		if s.name == name {
			return s
		}
	}
	return ipsetInfo{}
}

// createLine is kube-proxy's `ipset create` of a set, in restore syntax.
func createLine(s ipsetInfo) string {
	if s.typ == "bitmap:port" {
		return fmt.Sprintf("create %s %s range %s", s.name, s.typ, bitmapPortMax)
	}
	return fmt.Sprintf("create %s %s family %s hashsize %d maxelem %d", s.name, s.typ, hashFamily, hashSize, maxElem)
}

// setMatch is one entry of kube-proxy's ipsetWithIptablesChain: a rule
// `-A <from> [-p proto] -m comment --comment <set comment> -m set
// --match-set <set> <match> -j <to>`, written when the set is not empty.
type setMatch struct {
	set, table, from, to, match, proto string
}

var setMatches = []setMatch{
	{SetLoopBack, tableNAT, ChainPostrouting, "MASQUERADE", "dst,dst,src", ""},
	{SetLoadBalancer, tableNAT, ChainServices, ChainLoadBalancer, "dst,dst", ""},
	{SetLoadBalancerLocal, tableNAT, ChainLoadBalancer, "RETURN", "dst,dst", ""},
	{SetNodePortLocalTCP, tableNAT, ChainNodePort, "RETURN", "dst", "tcp"},
	{SetNodePortTCP, tableNAT, ChainNodePort, ChainMarkMasq, "dst", "tcp"},
	{SetNodePortLocalUDP, tableNAT, ChainNodePort, "RETURN", "dst", "udp"},
	{SetNodePortUDP, tableNAT, ChainNodePort, ChainMarkMasq, "dst", "udp"},
	{SetNodePortLocalSCTP, tableNAT, ChainNodePort, "RETURN", "dst,dst", "sctp"},
	{SetNodePortSCTP, tableNAT, ChainNodePort, ChainMarkMasq, "dst,dst", "sctp"},
	{SetLoadBalancerFW, tableFilter, ChainProxyFirewall, ChainSourceRangesFW, "dst,dst", ""},
	{SetLoadBalancerSourceCI, tableFilter, ChainSourceRangesFW, "RETURN", "dst,dst,src", ""},
	{SetLoadBalancerSourceIP, tableFilter, ChainSourceRangesFW, "RETURN", "dst,dst,src", ""},
}

// natChains and filterChains are kube-proxy's iptablesChains.
var (
	natChains    = []string{ChainServices, ChainPostrouting, ChainNodePort, ChainLoadBalancer, ChainMarkMasq}
	filterChains = []string{ChainForward, ChainNodePort, ChainProxyFirewall, ChainSourceRangesFW, ChainIPVSFilter, ChainIPVSOutFilter}
)

// jump is one of kube-proxy's iptablesJumpChain.
type jump struct{ table, from, to, comment string }

var jumps = []jump{
	{tableNAT, "OUTPUT", ChainServices, "kubernetes service portals"},
	{tableNAT, "PREROUTING", ChainServices, "kubernetes service portals"},
	{tableNAT, "POSTROUTING", ChainPostrouting, "kubernetes postrouting rules"},
	{tableFilter, "FORWARD", ChainForward, "kubernetes forwarding rules"},
	{tableFilter, "INPUT", ChainNodePort, "kubernetes health check rules"},
	{tableFilter, "INPUT", ChainProxyFirewall, "kube-proxy firewall rules"},
	{tableFilter, "FORWARD", ChainProxyFirewall, "kube-proxy firewall rules"},
	{tableFilter, "INPUT", ChainIPVSFilter, "kubernetes ipvs access filter"},
	{tableFilter, "OUTPUT", ChainIPVSOutFilter, "kubernetes ipvs access filter"},
}

// JumpRules is the iptables-restore --noflush input that links the built-in
// chains to kube-proxy's, each inserted at the top as kube-proxy's
// EnsureRule(Prepend) does (so the last one listed for a chain ends up
// first).
func JumpRules() string { return MissingJumpRules("") }

// MissingJumpRules is JumpRules without the rules that save, the output of
// `iptables-save`, already has (compared as iptables-save prints them): a
// rule inserted twice stays twice, since --noflush never flushes a built-in
// chain.
func MissingJumpRules(save string) string {
	have := iptables.SavedRules(save)
	var b strings.Builder
	for _, t := range []string{tableFilter, tableNAT} {
		fmt.Fprintf(&b, "*%s\n", t)
		for _, j := range jumps {
			rule := fmt.Sprintf("%s -m comment --comment %q -j %s", j.from, j.comment, j.to)
			if j.table == t && !have[t+" -A "+rule] {
				b.WriteString("-I " + rule + "\n")
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

// iptablesRules is writeIptablesRules for the sets' current contents: the
// chains declared (which flushes them under --noflush) and the constant
// rules, filter table first. It returns the text and its line count.
func (r *Renderer) iptablesRules(sets map[string][]string, lbNoNodeAccess []lbEntry) (string, int) {
	mark := r.cfg.masqMark()
	var nat, filter []string
	nat = append(nat, fmt.Sprintf("-A %s -s 127.0.0.0/8 -j RETURN", ChainServices))
	for _, m := range setMatches {
		if len(sets[m.set]) == 0 {
			continue
		}
		var l strings.Builder
		fmt.Fprintf(&l, "-A %s", m.from)
		if m.proto != "" {
			fmt.Fprintf(&l, " -p %s", m.proto)
		}
		fmt.Fprintf(&l, " -m comment --comment %q -m set --match-set %s %s -j %s", setInfo(m.set).comment, m.set, m.match, m.to)
		if m.table == tableFilter {
			filter = append(filter, l.String())
		} else {
			nat = append(nat, l.String())
		}
	}
	if len(sets[SetClusterIP]) > 0 {
		head := fmt.Sprintf("-A %s -m comment --comment %q -m set --match-set %s", ChainServices, setInfo(SetClusterIP).comment, SetClusterIP)
		switch {
		case r.cfg.MasqueradeAll:
			nat = append(nat, head+" dst,dst -j "+ChainMarkMasq)
		case r.cfg.ClusterCIDR.IsValid():
			// Off-cluster traffic to a service address is masqueraded.
			nat = append(nat, head+" dst,dst ! -s "+r.cfg.ClusterCIDR.String()+" -j "+ChainMarkMasq)
		default:
			// No local-traffic detector: masquerade traffic the node sends
			// from a service address.
			nat = append(nat, head+" src,dst -j "+ChainMarkMasq)
		}
	}
	nat = append(nat, externalIPRules(sets, SetExternalIP, true)...)
	nat = append(nat, externalIPRules(sets, SetExternalIPLocal, false)...)
	nat = append(nat,
		fmt.Sprintf("-A %s -m addrtype --dst-type LOCAL -j %s", ChainServices, ChainNodePort),
		fmt.Sprintf("-A %s -j %s", ChainLoadBalancer, ChainMarkMasq))
	if !r.cfg.Faults.Has(proxy.FaultSourceRangesOpen) {
		filter = append(filter, fmt.Sprintf("-A %s -j DROP", ChainSourceRangesFW))
	}
	// The node may not reach a load-balancer IP whose source ranges leave
	// it out (IPVS sees it with the address as source and destination).
	for _, e := range lbNoNodeAccess {
		filter = append(filter, fmt.Sprintf("-A %s -s %s -m ipvs --vaddr %s --vproto %s --vport %d -j DROP", ChainIPVSOutFilter, e.ip, e.ip, e.proto, e.port))
	}
	// acceptIPVSTraffic: the end of KUBE-SERVICES.
	for _, s := range []string{SetClusterIP, SetLoadBalancer} {
		if len(sets[s]) > 0 {
			nat = append(nat, fmt.Sprintf("-A %s -m set --match-set %s dst,dst -j ACCEPT", ChainServices, s))
		}
	}
	filter = append(filter,
		fmt.Sprintf(`-A %s -m comment --comment "kubernetes forwarding rules" -m mark --mark %s/%s -j ACCEPT`, ChainForward, mark, mark),
		fmt.Sprintf(`-A %s -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`, ChainForward),
		fmt.Sprintf("-A %s -m comment --comment %q -m set --match-set %s dst -j ACCEPT", ChainNodePort, setInfo(SetHealthCheckNodePort).comment, SetHealthCheckNodePort),
	)
	// KUBE-IPVS-FILTER (kubernetes#72236): a new connection to a service
	// address on a port that is not a service port is rejected.
	for _, s := range []string{SetLoadBalancer, SetClusterIP, SetExternalIP, SetExternalIPLocal} {
		filter = append(filter, fmt.Sprintf("-A %s -m set --match-set %s dst,dst -j RETURN", ChainIPVSFilter, s))
	}
	filter = append(filter,
		fmt.Sprintf("-A %s -m set --match-set %s dst -j RETURN", ChainIPVSFilter, SetHealthCheckNodePort),
		fmt.Sprintf("-A %s -m conntrack --ctstate NEW -m set --match-set %s dst -j REJECT", ChainIPVSFilter, SetIPVSIPs))
	nat = append(nat,
		fmt.Sprintf("-A %s -m mark ! --mark %s/%s -j RETURN", ChainPostrouting, mark, mark),
		fmt.Sprintf("-A %s -j MARK --xor-mark %s", ChainPostrouting, mark),
		fmt.Sprintf(`-A %s -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`, ChainPostrouting),
		fmt.Sprintf("-A %s -j MARK --or-mark %s", ChainMarkMasq, mark))

	return restoreText(filter, nat)
}

// externalIPRules are KUBE-SERVICES' rules for the external-IP set: traffic
// to an external IP is accepted from off the machine (not from a bridge
// port, not from a local address) and when the address is local;
// KUBE-EXTERNAL-IP's (masq) is masqueraded first. None for an empty set.
func externalIPRules(sets map[string][]string, set string, masq bool) []string {
	if len(sets[set]) == 0 {
		return nil
	}
	head := fmt.Sprintf("-A %s -m comment --comment %q -m set --match-set %s dst,dst", ChainServices, setInfo(set).comment, set)
	var out []string
	if masq {
		out = append(out, head+" -j "+ChainMarkMasq)
	}
	return append(out,
		head+" -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT",
		head+" -m addrtype --dst-type LOCAL -j ACCEPT")
}

// restoreText is the iptables-restore input of the filter and nat rules,
// every chain of each table declared first, and its line count.
func restoreText(filter, nat []string) (string, int) {
	var b strings.Builder
	n := 0
	line := func(s string) { b.WriteString(s); b.WriteByte('\n'); n++ }
	line("*filter")
	for _, c := range filterChains {
		line(":" + c + " - [0:0]")
	}
	for _, l := range filter {
		line(l)
	}
	line("COMMIT")
	line("*nat")
	for _, c := range natChains {
		line(":" + c + " - [0:0]")
	}
	for _, l := range nat {
		line(l)
	}
	line("COMMIT")
	return b.String(), n
}
