package diagnose

// The readers' side of external traffic (ServicePort.External): the path
// kube-proxy writes for connections from outside the cluster, one per
// service port, found by the hash or base its chains share (iptables
// KUBE-EXT-<hash>, nftables external-<base>).
//
// The endpoints of a path are what a new connection from outside reaches:
// the tracer walks one from an address outside the cluster (inside the
// load balancer's source ranges when it has some) to an external or
// load-balancer IP, else to a node port on an address the trace takes as
// the node's own. Under externalTrafficPolicy Local that is this node's
// endpoints only.
//
// Counts: iptables counts every rule. The external chain's last rule (the
// one pod and node traffic never reach) counts the connections from
// outside; the chain it jumps to splits them. Under Local that is the
// KUBE-SVL chain, which nothing else reaches (unless internalTrafficPolicy
// is Local too): its jumps count the outside connections per endpoint,
// apart from the cluster IP's. Under Cluster it is the port's own KUBE-SVC
// chain: the counts are the port's, cluster IP traffic included. nftables
// kube-proxy writes no counters: the paths have rules, not counts.

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/nftables"
	"github.com/kpsim/kpsim/dataplane/trace"
)

// nodeAddrForTrace is the address a node-port trace takes as the node's
// own when the dump names none: link-local, never a Service's.
var nodeAddrForTrace = netip.MustParseAddr("169.254.77.1")

// outsideCandidates are the client addresses of a trace from outside the
// cluster (documentation ranges), the first outside every prefix the
// rules treat as the cluster's.
var outsideCandidates = []netip.Addr{
	netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("203.0.113.200"), netip.MustParseAddr("192.0.2.250"),
}

// outsideAddr is the first candidate outside every prefix of avoid.
func outsideAddr(avoid []netip.Prefix) netip.Addr {
	for _, a := range outsideCandidates {
		if !slices.ContainsFunc(avoid, func(p netip.Prefix) bool { return p.Contains(a) }) {
			return a
		}
	}
	return outsideCandidates[0]
}

// firstHost is an address inside a source range.
func firstHost(p netip.Prefix) netip.Addr {
	p = p.Masked()
	if p.Bits() >= p.Addr().BitLen()-1 {
		return p.Addr()
	}
	return p.Addr().Next()
}

// externalPaths sets ServicePort.External: each port's KUBE-EXT chain,
// then the refusals of filter KUBE-EXTERNAL-SERVICES.
func (l *loader) externalPaths() {
	if l.nat != nil {
		for _, sp := range l.d.Ports {
			if xp := l.externalPath(sp); xp != nil {
				sp.External = xp
			}
		}
	}
	l.refusals()
}

// externalPath reads the port's KUBE-EXT chain, nil without one.
func (l *loader) externalPath(sp *ServicePort) *ExternalPath {
	h := ""
	for _, pre := range []string{iptables.PrefixSVC, iptables.PrefixSVL} {
		if x, ok := strings.CutPrefix(sp.Chain, pre); ok {
			h = x
		}
	}
	c := l.nat.chains[iptables.PrefixEXT+h]
	if h == "" || c == nil {
		return nil
	}
	xp := &ExternalPath{Chain: c.name, Endpoints: []*Endpoint{}, Evidence: []Line{c.decl}}
	target := ""
	var pods []netip.Prefix
	for _, r := range c.rules {
		t := ruleTarget(r.args)
		if !strings.HasPrefix(t, iptables.PrefixSVC) && !strings.HasPrefix(t, iptables.PrefixSVL) {
			continue
		}
		if s, neg, ok := optValue(r.args, "-s"); ok {
			if p, err := netip.ParsePrefix(s); err == nil && !neg {
				pods = append(pods, p) // "pod traffic for ... external destinations"
			}
			continue
		}
		if _, _, ok := optValue(r.args, "--src-type"); ok {
			continue // the node's own traffic
		}
		target = t
		xp.Outside += r.packets
		xp.Evidence = append(xp.Evidence, r.line)
	}
	xp.Local = strings.HasPrefix(target, iptables.PrefixSVL)
	xp.Reachable, _ = l.reach(c.name)
	l.externalCounts(sp, xp, target)
	l.traceExternal(sp, xp, pods)
	return xp
}

// externalCounts fills the path's endpoints from the chain the outside
// connections go to, with that chain's jump counters.
func (l *loader) externalCounts(sp *ServicePort, xp *ExternalPath, target string) {
	c := l.nat.chains[target]
	if c == nil {
		return
	}
	l.sepJumps(c, func(ep *Endpoint, _ *saveRule) {
		xp.Endpoints = append(xp.Endpoints, ep)
	}, func(*saveRule) { xp.SplitKnown = true })
	for _, ep := range xp.Endpoints {
		ep.Observed = ep.Fresh + ep.Sticky
		if !xp.SplitKnown {
			ep.Fresh, ep.Sticky = 0, 0
		}
	}
	switch {
	case target == sp.Chain:
		xp.Counted = CountedWithPort
	case !l.jumpedFromElsewhere(target, xp.Chain):
		xp.Counted = CountedApart
	}
}

// jumpedFromElsewhere reports whether a nat chain other than from jumps
// to chain (the jumps are indexed once: a large dump has thousands of
// ports).
func (l *loader) jumpedFromElsewhere(chain, from string) bool {
	if l.jumpers == nil {
		l.jumpers = map[string][]string{}
		for _, n := range l.nat.order {
			for _, r := range l.nat.chains[n].rules {
				if t := ruleTarget(r.args); strings.HasPrefix(t, "KUBE-") && !slices.Contains(l.jumpers[t], n) {
					l.jumpers[t] = append(l.jumpers[t], n)
				}
			}
		}
	}
	return slices.ContainsFunc(l.jumpers[chain], func(n string) bool { return n != from })
}

// traceExternal sets the path's P: a new connection from outside the
// cluster to one of the port's external destinations.
func (l *loader) traceExternal(sp *ServicePort, xp *ExternalPath, pods []netip.Prefix) {
	if len(sp.Frontends) == 0 {
		return
	}
	f := sp.Frontends[0]
	for _, g := range sp.Frontends {
		if g.Addr.IsValid() && !g.Ranges {
			f = g // an address every source may use
			break
		}
	}
	src := outsideAddr(pods)
	if f.Ranges {
		if rs := l.sourceRanges(f.Chain); len(rs) > 0 {
			src = firstHost(rs[0])
		}
	}
	dst := f.Addr
	if !dst.IsValid() {
		dst = nodeAddrForTrace
		l.fake.LocalAddrs = append(l.fake.LocalAddrs, dst)
		defer func() {
			l.fake.LocalAddrs = slices.DeleteFunc(l.fake.LocalAddrs, func(a netip.Addr) bool { return a == dst })
		}()
	}
	if l.overBudget {
		l.skip(f.Evidence, errTraceBudget.Error())
		return
	}
	res, err := l.fake.Trace(src, sp.Protocol, dst, f.Port, trace.History{})
	if err != nil {
		l.overBudget = strings.Contains(err.Error(), "rule evaluations")
		l.skip(f.Evidence, "could not trace a connection from outside the cluster: "+err.Error())
		return
	}
	addOutcomes(&xp.Endpoints, res)
}

// addOutcomes adds a trace's endpoint outcomes to eps (P), appending the
// endpoints the list lacks.
func addOutcomes(eps *[]*Endpoint, res trace.Result) {
	for _, o := range res {
		ap, err := netip.ParseAddrPort(o.Target)
		if err != nil || o.P <= 0 {
			continue
		}
		i := slices.IndexFunc(*eps, func(e *Endpoint) bool { return e.Addr == ap })
		if i < 0 {
			*eps = append(*eps, &Endpoint{Addr: ap})
			i = len(*eps) - 1
		}
		(*eps)[i].P += o.P
	}
}

// sourceRanges are the source prefixes a KUBE-FW chain lets on.
func (l *loader) sourceRanges(fw string) []netip.Prefix {
	var out []netip.Prefix
	if c := l.nat.chains[fw]; c != nil {
		for _, r := range c.rules {
			if s, neg, ok := optValue(r.args, "-s"); ok && !neg {
				if p, err := netip.ParsePrefix(s); err == nil {
					out = append(out, p)
				}
			}
		}
	}
	return out
}

// refusals reads filter KUBE-EXTERNAL-SERVICES: the REJECT ("has no
// endpoints") and DROP ("has no local endpoints") rules of a port's
// external IPs, load-balancer IPs (-d) and node port (addrtype LOCAL).
func (l *loader) refusals() {
	if l.flt == nil || l.flt.chains[iptables.ChainExternalServices] == nil {
		return
	}
	byName := map[string]*ServicePort{}
	for _, sp := range l.d.Ports {
		if k := sp.Name + "/" + sp.Protocol; sp.Name != "" && byName[k] == nil {
			byName[k] = sp
		}
	}
	for _, r := range l.flt.chains[iptables.ChainExternalServices].rules {
		v := ruleTarget(r.args)
		proto, _, _ := optValue(r.args, "-p")
		name := portName(comment(r.args))
		sp := byName[name+"/"+strings.ToLower(proto)]
		if (v != "REJECT" && v != "DROP") || name == "" || sp == nil {
			continue
		}
		rf := Refusal{Verdict: v, Packets: r.packets, Evidence: r.line}
		if k, ok := dispatch(r.args); ok {
			rf.What, rf.Addr, rf.Port = frontendWhat(sp, k.ip), k.ip, k.port
		} else if t, _, ok := optValue(r.args, "--dst-type"); ok && t == "LOCAL" {
			dp, _, _ := optValue(r.args, "--dport")
			port, err := strconv.Atoi(dp)
			if err != nil {
				continue
			}
			rf.What, rf.Port = "node port", port
		} else {
			continue
		}
		if sp.External == nil {
			sp.External = &ExternalPath{Endpoints: []*Endpoint{}}
		}
		sp.External.Local = sp.External.Local || strings.HasSuffix(comment(r.args), " has no local endpoints")
		sp.External.Refused = append(sp.External.Refused, rf)
	}
}

// frontendWhat names an external address of a port: what its frontend
// says, else either kind (the rules of a port without endpoints do not
// tell them apart).
func frontendWhat(sp *ServicePort, a netip.Addr) string {
	for _, f := range sp.Frontends {
		if f.Addr == a {
			return f.What
		}
	}
	return "external or load-balancer IP"
}

// externalPaths sets ServicePort.External in an nftables dump: for a
// port whose own address is external (its chain is external-B) that
// chain, for a cluster IP port the external-B of its base; then the
// refusals of no-endpoint-nodeports and of the external addresses of
// no-endpoint-services.
func (k *nftKube) externalPaths() {
	for _, sp := range k.d.Ports {
		chain := sp.Chain
		for _, pre := range []string{nftables.PrefixService, nftables.PrefixLocal} {
			if b, ok := strings.CutPrefix(sp.Chain, pre); ok {
				chain = nftables.PrefixExternal + b
			}
		}
		if !strings.HasPrefix(chain, nftables.PrefixExternal) || k.chains[chain] == nil {
			continue
		}
		xp := &ExternalPath{Chain: chain, Endpoints: []*Endpoint{}, Evidence: []Line{k.chains[chain].line}}
		xp.Reachable, xp.Local = k.reach(chain)
		xp.Ranges = sp.Chain == chain && k.firewallRange(sp.ClusterIP, sp.Protocol, sp.Port).IsValid()
		k.traceExternal(sp, xp)
		sp.External = xp
	}
	k.refusals()
}

// traceExternal sets the path's endpoints and P from a trace of a new
// connection from outside the cluster: to the port's own address when it
// is external, else to an external address that goes to the same chain,
// else to a node port on the node's address (nodeport-ips, or one the
// trace takes as the node's).
func (k *nftKube) traceExternal(sp *ServicePort, xp *ExternalPath) {
	dst, port := sp.ClusterIP, sp.Port
	if sp.Chain != xp.Chain {
		dst, port = k.externalAddr(xp.Chain)
	}
	tr := k.tracer
	if !dst.IsValid() {
		if len(sp.Frontends) == 0 {
			return
		}
		port = sp.Frontends[0].Port
		var err error
		if dst, tr, err = k.nodeTracer(); err != nil {
			k.d.Skipped = append(k.d.Skipped, Skipped{Line: xp.Evidence[0], Reason: "could not trace a connection from outside the cluster: " + err.Error()})
			return
		}
	}
	res, err := tr.Trace(trace.Packet{Src: k.outsideSource(dst, sp.Protocol, port), Protocol: sp.Protocol, Dst: dst, DPort: port}, nil)
	if err != nil {
		k.d.Skipped = append(k.d.Skipped, Skipped{Line: xp.Evidence[0], Reason: "could not trace a connection from outside the cluster: " + err.Error()})
		return
	}
	addOutcomes(&xp.Endpoints, res)
	for _, e := range xp.Endpoints {
		for _, pe := range sp.Endpoints {
			if pe.Addr == e.Addr {
				e.Chain, e.Evidence = pe.Chain, pe.Evidence
			}
		}
	}
}

// outsideSource is the client of a trace from outside the cluster to
// dst: inside the destination's source ranges when it has some, else
// outside the pod range.
func (k *nftKube) outsideSource(dst netip.Addr, proto string, port int) netip.Addr {
	if r := k.firewallRange(dst, proto, port); r.IsValid() {
		return firstHost(r)
	}
	var avoid []netip.Prefix
	if k.pods.IsValid() {
		avoid = append(avoid, k.pods)
	}
	return outsideAddr(avoid)
}

// externalAddr is an address of service-ips that goes to chain (the
// map is indexed by chain once).
func (k *nftKube) externalAddr(chain string) (netip.Addr, int) {
	if k.extAddrs == nil {
		k.extAddrs = map[string]netip.AddrPort{}
		if m := k.sets["service-ips"]; m != nil {
			for _, e := range m.elems {
				v := strings.Fields(strings.Join(e.value, " "))
				if ip, _, port, ok := nftPortKey(e.key); ok && len(v) == 2 && strings.HasPrefix(v[1], nftables.PrefixExternal) {
					if _, dup := k.extAddrs[v[1]]; !dup {
						k.extAddrs[v[1]] = netip.AddrPortFrom(ip, uint16(port))
					}
				}
			}
		}
	}
	ap, ok := k.extAddrs[chain]
	if !ok {
		return netip.Addr{}, 0
	}
	return ap.Addr(), int(ap.Port())
}

// nodeTracer is a tracer that takes a node address as local: the first
// element of nodeport-ips, else nodeAddrForTrace (kube-proxy then
// matches node ports with fib daddr type local).
func (k *nftKube) nodeTracer() (netip.Addr, *nftables.Tracer, error) {
	a := nodeAddrForTrace
	if s := k.sets["nodeport-ips"]; s != nil && len(s.elems) > 0 && len(s.elems[0].key) == 1 {
		if x, err := netip.ParseAddr(s.elems[0].key[0]); err == nil {
			a = x
		}
	}
	if k.nodeTr == nil {
		t, err := nftables.NewTracer(k.fake, a)
		if err != nil {
			return a, nil, err
		}
		k.nodeTr = t
	}
	return a, k.nodeTr, nil
}

// firewallRange is the first source range a firewall-ips element lets
// on to the destination (its chain's `ip saddr != RANGE drop`), invalid
// when it has none.
func (k *nftKube) firewallRange(dst netip.Addr, proto string, port int) netip.Prefix {
	m := k.sets["firewall-ips"]
	if m == nil {
		return netip.Prefix{}
	}
	for _, e := range m.elems {
		v := strings.Fields(strings.Join(e.value, " "))
		ip, p, n, ok := nftPortKey(e.key)
		if !ok || ip != dst || p != proto || n != port || len(v) != 2 || k.chains[v[1]] == nil {
			continue
		}
		for _, r := range k.chains[v[1]].rules {
			w := strings.Fields(r.text)
			for i := 0; i+3 < len(w); i++ {
				if w[i] == "ip" && w[i+1] == "saddr" && w[i+2] == "!=" {
					if pf, err := netip.ParsePrefix(strings.Trim(w[i+3], "{},")); err == nil {
						return pf
					}
					if a, err := netip.ParseAddr(strings.Trim(w[i+3], "{},")); err == nil {
						return netip.PrefixFrom(a, a.BitLen())
					}
				}
			}
		}
	}
	return netip.Prefix{}
}

// refusals reads no-endpoint-nodeports ("PROTO . PORT comment NAME :
// VERDICT") and the elements of no-endpoint-services whose address is no
// cluster IP: each to the cluster IP port its comment names.
func (k *nftKube) refusals() {
	clusterIPs := map[string]bool{}
	if s := k.sets["cluster-ips"]; s != nil {
		for _, e := range s.elems {
			clusterIPs[strings.Join(e.key, "")] = true
		}
	}
	byName := map[string]*ServicePort{}
	for _, sp := range k.d.Ports {
		if key := sp.Name + "/" + sp.Protocol; clusterIPs[sp.ClusterIP.String()] && byName[key] == nil {
			byName[key] = sp
		}
	}
	add := func(e nftElem, rf Refusal, proto string) {
		sp := byName[e.comment+"/"+proto]
		if sp == nil || e.comment == "" {
			return
		}
		switch v := strings.Join(e.value, " "); {
		case v == "drop":
			rf.Verdict = "DROP"
		case v == "reject" || strings.HasSuffix(v, " reject-chain"):
			rf.Verdict = "REJECT"
		default:
			return
		}
		if sp.External == nil {
			sp.External = &ExternalPath{Endpoints: []*Endpoint{}}
		}
		sp.External.Local = sp.External.Local || rf.Verdict == "DROP"
		sp.External.Refused = append(sp.External.Refused, rf)
	}
	if m := k.sets["no-endpoint-nodeports"]; m != nil {
		for _, e := range m.elems {
			if port, err := strconv.Atoi(e.key[len(e.key)-1]); err == nil && len(e.key) == 2 {
				add(e, Refusal{What: "node port", Port: port, Evidence: e.line}, e.key[0])
			}
		}
	}
	if m := k.sets["no-endpoint-services"]; m != nil {
		for _, e := range m.elems {
			if ip, proto, port, ok := nftPortKey(e.key); ok && !clusterIPs[ip.String()] {
				add(e, Refusal{What: "external or load-balancer IP", Addr: ip, Port: port, Evidence: e.line}, proto)
			}
		}
	}
}
