package diagnose

// A service port's other destinations (ServicePort.Frontends): external
// IPs, load-balancer IPs and the node port, as the iptables and nftables
// layouts write them apart from the port's own address. The conntrack
// analysis needs them: an entry's original destination is whichever of
// them the client used. kube-proxy names a port's chains from one hash
// (KUBE-SVC-H, KUBE-SVL-H, KUBE-EXT-H, KUBE-FW-H; service-B, local-B,
// external-B), which is how a frontend finds its port.

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/nftables"
)

// frontends adds the iptables frontends: KUBE-SERVICES rules to a
// KUBE-EXT- or KUBE-FW- chain (external and load-balancer IPs) and
// KUBE-NODEPORTS rules (node ports; the 127.0.0.0/8 copy of a node port
// rule is the same node port).
func (l *loader) frontends() {
	if l.nat == nil {
		return
	}
	byHash := map[string]*ServicePort{}
	for _, sp := range l.d.Ports {
		for _, pre := range []string{iptables.PrefixSVC, iptables.PrefixSVL} {
			if h, ok := strings.CutPrefix(sp.Chain, pre); ok {
				byHash[h] = sp
			}
		}
	}
	if c := l.nat.chains[iptables.ChainServices]; c != nil {
		for _, r := range c.rules {
			tgt := ruleTarget(r.args)
			fw := strings.HasPrefix(tgt, iptables.PrefixFW)
			k, ok := dispatch(r.args)
			if !ok || !(fw || strings.HasPrefix(tgt, iptables.PrefixEXT)) {
				continue
			}
			what := "external IP"
			if fw || strings.HasSuffix(comment(r.args), " loadbalancer IP") {
				what = "load-balancer IP"
			}
			f := Frontend{What: what, Addr: k.ip, Port: k.port, Chain: tgt, Packets: r.packets, Ranges: fw, Evidence: r.line}
			if fw {
				f.Allowed, f.Denied = l.firewall(tgt, k)
			}
			l.addFrontend(byHash, k.proto, f)
		}
	}
	if c := l.nat.chains[iptables.ChainNodePorts]; c != nil {
		// The rule for every address first: its line is the evidence.
		rules := slices.Clone(c.rules)
		slices.SortStableFunc(rules, func(a, b *saveRule) int {
			_, _, da := optValue(a.args, "-d")
			_, _, db := optValue(b.args, "-d")
			return cmp.Compare(boolInt(da), boolInt(db))
		})
		for _, r := range rules {
			tgt := ruleTarget(r.args)
			proto, neg, ok := optValue(r.args, "-p")
			dp, dneg, dok := optValue(r.args, "--dport")
			port, err := strconv.Atoi(dp)
			if !strings.HasPrefix(tgt, iptables.PrefixEXT) || !ok || neg || !dok || dneg || err != nil || port < 1 || port > 65535 {
				continue
			}
			l.addFrontend(byHash, strings.ToLower(proto), Frontend{What: "node port", Port: port, Chain: tgt, Packets: r.packets, Evidence: r.line})
		}
	}
	for _, sp := range l.d.Ports {
		sortFrontends(sp.Frontends)
	}
}

func (l *loader) addFrontend(byHash map[string]*ServicePort, proto string, f Frontend) {
	_, h, _ := strings.Cut(strings.TrimPrefix(f.Chain, "KUBE-"), "-")
	sp := byHash[h]
	if sp == nil || sp.Protocol != proto {
		return
	}
	if i := slices.IndexFunc(sp.Frontends, func(g Frontend) bool {
		return g.What == f.What && g.Addr == f.Addr && g.Port == f.Port
	}); i >= 0 {
		sp.Frontends[i].Packets += f.Packets // the 127.0.0.0/8 copy of a node port rule
		return
	}
	f.Endpoints, f.Local = l.reach(f.Chain)
	sp.Frontends = append(sp.Frontends, f)
}

// firewall reads a load-balancer IP's source ranges: the packets of the
// KUBE-FW chain's rules that let a source on to the external chain, and
// of filter KUBE-PROXY-FIREWALL's DROP rule for the address.
func (l *loader) firewall(fw string, k portKey) (allowed, denied uint64) {
	if c := l.nat.chains[fw]; c != nil {
		for _, r := range c.rules {
			if _, neg, ok := optValue(r.args, "-s"); ok && !neg && strings.HasPrefix(ruleTarget(r.args), iptables.PrefixEXT) {
				allowed += r.packets
			}
		}
	}
	if l.flt == nil {
		return allowed, 0
	}
	if c := l.flt.chains[iptables.ChainProxyFirewall]; c != nil {
		for _, r := range c.rules {
			if dk, ok := dispatch(r.args); ok && dk == k && ruleTarget(r.args) == "DROP" {
				denied += r.packets
			}
		}
	}
	return allowed, denied
}

// reach walks the nat chains from chain: the DNAT destinations of the
// KUBE-SEP chains it reaches, and whether it reaches a KUBE-SVL chain.
func (l *loader) reach(chain string) (eps []netip.AddrPort, local bool) {
	seen := map[string]bool{}
	var walk func(string, int)
	walk = func(name string, depth int) {
		c := l.nat.chains[name]
		if c == nil || seen[name] || depth > 8 {
			return
		}
		seen[name] = true
		local = local || strings.HasPrefix(name, iptables.PrefixSVL)
		for _, r := range c.rules {
			t := ruleTarget(r.args)
			if t == "DNAT" && strings.HasPrefix(name, iptables.PrefixSEP) {
				to, _, _ := optValue(r.args, "--to-destination")
				if ap, err := netip.ParseAddrPort(to); err == nil && !slices.Contains(eps, ap) {
					eps = append(eps, ap)
				}
				continue
			}
			if strings.HasPrefix(t, "KUBE-") {
				walk(t, depth+1)
			}
		}
	}
	walk(chain, 0)
	slices.SortFunc(eps, netip.AddrPort.Compare)
	return eps, local
}

// frontends adds the nftables node ports: service-nodeports elements
// "PROTO . PORT : goto external-B", each to the port whose service- or
// local- chain has the base B.
func (k *nftKube) frontends() {
	m := k.sets["service-nodeports"]
	if m == nil || !m.isMap {
		return
	}
	byBase := map[string]*ServicePort{}
	for _, sp := range k.d.Ports {
		for _, pre := range []string{nftables.PrefixService, nftables.PrefixLocal} {
			if b, ok := strings.CutPrefix(sp.Chain, pre); ok {
				byBase[b] = sp
			}
		}
	}
	for _, e := range m.elems {
		verdict := strings.Fields(strings.Join(e.value, " "))
		if len(e.key) != 2 || len(verdict) != 2 || (verdict[0] != "goto" && verdict[0] != "jump") {
			continue
		}
		port, err := strconv.Atoi(e.key[1])
		base, ok := strings.CutPrefix(verdict[1], nftables.PrefixExternal)
		sp := byBase[base]
		if err != nil || !ok || sp == nil || sp.Protocol != e.key[0] {
			continue
		}
		eps, local := k.reach(verdict[1])
		sp.Frontends = append(sp.Frontends, Frontend{What: "node port", Port: port, Chain: verdict[1], Endpoints: eps, Local: local, Evidence: e.line})
		sortFrontends(sp.Frontends)
	}
}

// reach walks the table from chain: the DNAT targets it reaches, and
// whether it reaches a local- chain.
func (k *nftKube) reach(chain string) (eps []netip.AddrPort, local bool) {
	seen := map[string]bool{}
	var walk func(string, int)
	walk = func(name string, depth int) {
		c := k.chains[name]
		if c == nil || seen[name] || depth > 8 {
			return
		}
		seen[name] = true
		local = local || strings.HasPrefix(name, nftables.PrefixLocal)
		for i := range c.rules {
			r := &c.rules[i]
			if k.skipped[r] {
				continue
			}
			for _, ap := range dnatTargets(r.text) {
				if !slices.Contains(eps, ap) {
					eps = append(eps, ap)
				}
			}
			for _, t := range chainTargets(r.text) {
				walk(t, depth+1)
			}
		}
	}
	walk(chain, 0)
	slices.SortFunc(eps, netip.AddrPort.Compare)
	return eps, local
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func sortFrontends(fs []Frontend) {
	slices.SortFunc(fs, func(a, b Frontend) int {
		return cmp.Or(cmp.Compare(a.What, b.What), a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	})
}
