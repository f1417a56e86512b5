package diagnose

// The analysis of external traffic: per service port, the destinations a
// client outside the cluster uses (node port, external IPs, load-balancer
// IPs: entries) with what the rules counted on each, and the split of the
// outside connections over the endpoints, tested as the ports' splits are
// (rules against the intended split; counts by Pearson chi-square in the
// dump's Holm family).
//
// Where the split's counts come from depends on the mode (ExternalPath):
//
//	iptables, externalTrafficPolicy Local:   KUBE-SVL's jumps, outside traffic only: a split of its own
//	iptables, Cluster:                       the port's KUBE-SVC counters (cluster IP traffic too): the port's verdict
//	nftables:                                no counters; the rules of the external chain (a split of its own, or
//	                                         the port of an external or load-balancer IP, whose split it is)
//	IPVS:                                    each external address is a virtual server: its own port and verdict
//
// Under Local each node sends the connections that reach it to its own
// endpoints only; placement.go compares nodes.

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// ExternalReport is one service port's traffic from outside the cluster
// on the dump's node.
type ExternalReport struct {
	// Port is the service port (its label) and Key its cluster IP key.
	Port  string `json:"port"`
	Key   string `json:"key"`
	Node  string `json:"node,omitempty"`
	Chain string `json:"chain,omitempty"`
	// Policy is "Local" or "Cluster" (externalTrafficPolicy as the rules
	// apply it).
	Policy  string         `json:"policy"`
	Entries []*EntryReport `json:"entries"`
	// Outside is the new connections from outside the chain counted.
	Outside uint64 `json:"outside,omitempty"`
	// Counted: CountedApart, CountedWithPort or "" (ExternalPath.Counted).
	Counted string `json:"counted,omitempty"`
	// Split is the outside connections' split when it is a split of its
	// own (counted apart, or rules only with no port of its own); else
	// SplitOf names the port whose split it is.
	Split   *PortReport `json:"split,omitempty"`
	SplitOf string      `json:"splitOf,omitempty"`
	// Verdict is the split's verdict (Split's, or SplitOf's).
	Verdict  string `json:"verdict"`
	Evidence []Line `json:"evidence,omitempty"`

	path *ExternalPath
	port *ServicePort
	ap   *apiPort // the API's port, when --api names it
	file string   // the dump it comes from
	// own are the entries' ports of their own (nftables external and
	// load-balancer IPs, IPVS virtual servers): their splits are the
	// outside connections'.
	own []*PortReport
}

// EntryReport is one external destination of a port.
type EntryReport struct {
	// What is "node port", "external IP", "load-balancer IP" (or
	// "external or load-balancer IP" where the rules do not say and no
	// API does).
	What string `json:"what"`
	Dest string `json:"dest"` // "192.0.2.130:80", "*:31130", "198.18.0.3:31130" (IPVS)
	// Connections are the new connections its rule counted (Counted).
	Connections uint64 `json:"connections"`
	Counted     bool   `json:"counted"`
	// Ranges: a load-balancer IP with source ranges; Allowed and Denied
	// split its connections (Denied: packets KUBE-PROXY-FIREWALL dropped).
	Ranges  bool   `json:"ranges,omitempty"`
	Allowed uint64 `json:"allowed,omitempty"`
	Denied  uint64 `json:"denied,omitempty"`
	// Refused is "REJECT" or "DROP" when the rules refuse the destination
	// (no endpoint, or Local without a local one); RefusedN its packets.
	Refused  string `json:"refused,omitempty"`
	RefusedN uint64 `json:"refusedPackets,omitempty"`
	// Port is the port of its own whose split this entry's is (nftables
	// external and load-balancer IPs, IPVS virtual servers), Verdict that
	// port's verdict.
	Port     string `json:"ownPort,omitempty"`
	Verdict  string `json:"verdict,omitempty"`
	Evidence Line   `json:"evidence"`

	addr netip.Addr
}

// externals builds the report's external section from the dump (before
// the tests: the splits of their own join the Holm family).
func (r *Report) externals(d *Dump, before *Dump) {
	byChain := map[string]*ExternalReport{}
	for _, pr := range r.Ports {
		p := pr.port
		xp := p.External
		if xp == nil || (xp.Chain != "" && xp.Chain == p.Chain) {
			continue
		}
		policy := policyWord(xp.Local)
		if xp.Chain == "" && !xp.Local {
			policy = "" // refused for want of any endpoint: the rules do not say
		}
		xr := &ExternalReport{Port: pr.Label(), Key: pr.Key, Node: r.Node, Chain: xp.Chain, Policy: policy,
			Outside: xp.Outside, Counted: xp.Counted, Evidence: xp.Evidence, path: xp, port: p, file: r.File}
		for _, f := range p.Frontends {
			xr.Entries = append(xr.Entries, entryOf(f, d.Counters))
		}
		for _, rf := range xp.Refused {
			xr.Entries = append(xr.Entries, &EntryReport{What: rf.What, Dest: destWords(rf.Addr, rf.Port), Refused: rf.Verdict,
				RefusedN: rf.Packets, Counted: d.Counters, Evidence: rf.Evidence, addr: rf.Addr})
		}
		r.External = append(r.External, xr)
		if xp.Chain != "" {
			byChain[xp.Chain] = xr
		}
	}
	r.ownExternal(byChain)
	beforePorts := portsByKey(before)
	for _, xr := range r.External {
		if bp := beforePorts[xr.Key]; bp != nil && d.Counters {
			entryDeltas(xr, bp)
		}
		r.externalSplit(xr, d, beforePorts)
	}
	if d.Mode == "ipvs" {
		r.ipvsExternals()
		if r.api == nil && len(r.Ports) > 0 {
			r.add(LevelNote, KindNotTested, nil, "IPVS writes a virtual server per cluster IP, external IP, load-balancer IP and node address with node port alike: --api tells which are external destinations (the external section and the Local placement need it)")
		}
	}
}

// ownExternal adds the ports whose own address is external (nftables:
// a service-ips element to an external- chain) to their chain's report
// as entries, and names them the split's port.
func (r *Report) ownExternal(byChain map[string]*ExternalReport) {
	for _, pr := range r.Ports {
		p := pr.port
		if p.External == nil || p.External.Chain == "" || p.External.Chain != p.Chain {
			continue
		}
		xr := byChain[p.Chain]
		if xr == nil {
			xr = &ExternalReport{Port: pr.Label(), Key: pr.Key, Node: r.Node, Chain: p.Chain, Policy: policyWord(p.External.Local),
				Evidence: p.External.Evidence, path: p.External, port: p, file: r.File}
			byChain[p.Chain] = xr
			r.External = append(r.External, xr)
		}
		what := "external or load-balancer IP"
		if r.firewalled(p) {
			what = "load-balancer IP"
		}
		xr.Entries = append(xr.Entries, &EntryReport{What: what, Dest: destWords(p.ClusterIP, p.Port), Port: ownLabel(pr),
			Ranges: r.firewalled(p), Evidence: p.Evidence[0], addr: p.ClusterIP})
		xr.own = append(xr.own, pr)
		if xr.SplitOf == "" {
			xr.SplitOf = ownLabel(pr)
		}
	}
}

// firewalled reports a port whose own address has source ranges (an
// nftables load-balancer IP in firewall-ips).
func (r *Report) firewalled(p *ServicePort) bool { return p.External != nil && p.External.Ranges }

func ownLabel(pr *PortReport) string { return pr.Label() }

func policyWord(local bool) string {
	if local {
		return "Local"
	}
	return "Cluster"
}

func destWords(a netip.Addr, port int) string {
	if !a.IsValid() {
		return fmt.Sprintf("*:%d", port)
	}
	return netip.AddrPortFrom(a, uint16(port)).String()
}

func entryOf(f Frontend, counted bool) *EntryReport {
	return &EntryReport{What: f.What, Dest: destWords(f.Addr, f.Port), Connections: f.Packets, Counted: counted,
		Ranges: f.Ranges, Allowed: f.Allowed, Denied: f.Denied, Evidence: f.Evidence, addr: f.Addr}
}

// externalSplit decides whose split the outside connections are: a split
// of their own (counted apart; or rules only when no port has them), the
// port's (iptables Cluster: the same KUBE-SVC counters), or an own
// external port's (nftables).
func (r *Report) externalSplit(xr *ExternalReport, d *Dump, beforePorts map[string]*ServicePort) {
	xp := xr.path
	switch {
	case len(xp.Endpoints) == 0:
		xr.Verdict = "no endpoints"
		return
	case xp.Counted == CountedWithPort:
		xr.SplitOf = xr.Port
		return
	case xr.SplitOf != "":
		return
	}
	p := xr.port
	sp := &ServicePort{Name: xr.Port, ClusterIP: p.ClusterIP, Port: p.Port, Protocol: p.Protocol, Chain: xp.Chain,
		Endpoints: xp.Endpoints, Scheduler: p.Scheduler, Exact: p.Exact, SplitKnown: xp.SplitKnown,
		LocalOnly: xp.Local, Evidence: xp.Evidence}
	if d.Counters && xp.Counted == CountedApart {
		sp.Affinity = p.Affinity // the fresh choices are counted apart
	} else {
		for _, e := range sp.Endpoints {
			e.Observed, e.Fresh, e.Sticky = 0, 0, 0
		}
	}
	pr := newPortReport(sp)
	pr.Name, pr.Key = splitLabel(xr), pr.Key+" external"
	pr.external = true
	if xp.Counted != CountedApart {
		pr.rulesOnly = true // no counts of its own: rules only
	}
	if bp := beforePorts[xr.Key]; bp != nil && bp.External != nil && d.Counters && xp.Counted == CountedApart {
		if reset := applyDelta(pr, &ServicePort{Endpoints: bp.External.Endpoints}); reset != "" {
			r.add(LevelNote, KindCountersReset, pr, reset, pr.Evidence...)
		}
	}
	xr.Split = pr
}

// splitLabel names an external split in findings: the port, the policy
// and the node ("demo/web:http (external, Local, node-c)").
func splitLabel(xr *ExternalReport) string {
	words := []string{"external", xr.Policy}
	if xr.Node != "" {
		words = append(words, xr.Node)
	}
	return xr.Port + " (" + strings.Join(words, ", ") + ")"
}

// portsByKey indexes a dump's ports (nil for a nil dump).
func portsByKey(d *Dump) map[string]*ServicePort {
	if d == nil {
		return nil
	}
	out := map[string]*ServicePort{}
	for _, p := range d.Ports {
		out[spKey(p)] = p
	}
	return out
}

// entryDeltas turns the entries' counts and the outside total into after
// minus before (the later count alone when one went down: kube-proxy
// rewrites KUBE-SERVICES and KUBE-NODEPORTS at every sync).
func entryDeltas(xr *ExternalReport, bp *ServicePort) {
	if bx := bp.External; bx != nil && bx.Outside <= xr.Outside {
		xr.Outside -= bx.Outside
	}
	for _, e := range xr.Entries {
		for _, f := range bp.Frontends {
			if destWords(f.Addr, f.Port) == e.Dest && f.What == e.What && f.Packets <= e.Connections && f.Denied <= e.Denied && f.Allowed <= e.Allowed {
				e.Connections -= f.Packets
				e.Allowed -= f.Allowed
				e.Denied -= f.Denied
			}
		}
		if bp.External == nil {
			continue
		}
		for _, rf := range bp.External.Refused {
			if destWords(rf.Addr, rf.Port) == e.Dest && rf.Verdict == e.Refused && rf.Packets <= e.RefusedN {
				e.RefusedN -= rf.Packets
			}
		}
	}
}

// splits are the external splits of their own, in report order.
func (r *Report) splits() []*PortReport {
	var out []*PortReport
	for _, xr := range r.External {
		if xr.Split != nil {
			out = append(out, xr.Split)
		}
	}
	return append(out, r.peerSplits...)
}

// externalVerdicts copies each report's verdict from its split or the
// port it names, once the tests ran.
func (r *Report) externalVerdicts() {
	byLabel := map[string]*PortReport{}
	for _, pr := range r.Ports {
		byLabel[pr.Label()] = pr
		byLabel[ownLabel(pr)] = pr
	}
	for _, xr := range r.External {
		for _, e := range xr.Entries {
			if pr := byLabel[e.Port]; e.Port != "" && pr != nil {
				e.Verdict = pr.Verdict
				if xr.Counted == "" {
					e.Connections, e.Counted = pr.N, r.Counters
				}
			}
		}
		switch {
		case xr.Split != nil:
			xr.Verdict = xr.Split.Verdict
		case len(xr.own) > 0:
			xr.SplitOf, xr.Verdict = ownVerdict(xr.own)
		case xr.SplitOf != "" && byLabel[xr.SplitOf] != nil:
			xr.Verdict = byLabel[xr.SplitOf].Verdict
		}
	}
}

// ownVerdict sums up the ports of their own of a report: the first whose
// rules or counts are uneven, else the busiest one.
func ownVerdict(own []*PortReport) (label, verdict string) {
	best := own[0]
	for _, pr := range own {
		if pr.Verdict == "skewed" || pr.Verdict == "rules unequal" {
			return pr.Label(), pr.Verdict
		}
		if pr.N > best.N {
			best = pr
		}
	}
	return best.Label(), best.Verdict
}

// ipvsExternals makes the IPVS section: each virtual server the API
// names an external destination of a service port (a node port on a
// node address, an external IP, a load-balancer IP) is an entry of that
// port's report, its split its own port's. Without --api the virtual
// servers cannot be told apart from cluster IPs.
func (r *Report) ipvsExternals() {
	if r.api == nil {
		return
	}
	api := r.apiPorts()
	byKey := map[string]*ExternalReport{}
	for _, pr := range r.Ports {
		if api[pr.Key] != nil || pr.port.FWMark != 0 {
			continue
		}
		ap := external(api, pr)
		if ap == nil {
			continue
		}
		key := Key(netip.MustParseAddr(ap.svc.Spec.ClusterIP), int(ap.port.Port), protoOf(ap.port.Protocol))
		xr := byKey[key]
		if xr == nil {
			xr = &ExternalReport{Port: ap.name, Key: key, Node: r.Node, Policy: policyWord(ap.etpLocal), ap: ap, file: r.File}
			byKey[key] = xr
			r.External = append(r.External, xr)
		}
		if pr.Name == "" {
			pr.Name = ap.name
		}
		if pr.Via == "" {
			pr.Via = apiWhat(ap, pr.port) + " " + destWords(pr.port.ClusterIP, pr.port.Port)
		}
		e := &EntryReport{What: apiWhat(ap, pr.port), Dest: destWords(pr.port.ClusterIP, pr.port.Port), Port: ownLabel(pr),
			Connections: pr.N, Counted: r.Counters, addr: pr.port.ClusterIP}
		if len(pr.Evidence) > 0 {
			e.Evidence = pr.Evidence[0]
		}
		xr.Entries = append(xr.Entries, e)
		xr.own = append(xr.own, pr)
		if xr.SplitOf == "" {
			xr.SplitOf = ownLabel(pr)
		}
	}
	slices.SortStableFunc(r.External, func(a, b *ExternalReport) int { return strings.Compare(a.Key, b.Key) })
}

// apiWhat names an external destination by the API: one of the
// Service's load-balancer ingress IPs, external IPs, else its node port.
func apiWhat(ap *apiPort, p *ServicePort) string {
	for _, in := range ap.svc.Status.LoadBalancer.Ingress {
		if in.IP == p.ClusterIP.String() && int(ap.port.Port) == p.Port {
			return "load-balancer IP"
		}
	}
	if slices.Contains(ap.svc.Spec.ExternalIPs, p.ClusterIP.String()) && int(ap.port.Port) == p.Port {
		return "external IP"
	}
	return "node port"
}

// externalAPI compares each external report with the API: the entries'
// kinds, externalTrafficPolicy against the rules, and a split's
// endpoints against the ones the policy selects.
func (r *Report) externalAPI(d *Dump, zone string) {
	if r.api == nil {
		return
	}
	api := r.apiPorts()
	for _, xr := range r.External {
		ap := api[xr.Key]
		if ap == nil {
			continue
		}
		xr.ap = ap
		if xr.Policy == "" {
			xr.Policy = policyWord(ap.etpLocal)
		}
		for _, e := range xr.Entries {
			if e.Port != "" || strings.HasPrefix(e.What, "external or") {
				if e.addr.IsValid() {
					e.What = apiWhat(ap, &ServicePort{ClusterIP: e.addr, Port: int(ap.port.Port)})
				}
			}
		}
		ev := append([]Line{ap.svcLine}, xr.Evidence...)
		// A split of its own, or a port of its own, is held to the
		// policy by compareEndpoints.
		checked := xr.Split != nil || (xr.SplitOf != "" && xr.SplitOf != xr.Port)
		switch {
		case ap.etpLocal && !checked && xr.Policy != "Local" && xr.path != nil && len(xr.path.Endpoints) > 0:
			r.addExt(LevelFinding, KindLocalIgnored, xr, "the Service has externalTrafficPolicy Local but the rules send connections from outside to every node's endpoints", ev...)
		case !ap.etpLocal && xr.Policy == "Local":
			r.addExt(LevelFinding, KindLocalIgnored, xr, "the rules send connections from outside to this node's endpoints only (Local), but the Service has externalTrafficPolicy Cluster", ev...)
		}
		if xr.Split != nil {
			compareEndpoints(r, xr.Split, ap, r.Node, zone, d.Mode, true)
		}
		if xr.Policy == "Local" && r.Node != "" && len(localSet(ap.eps, r.Node)) == 0 {
			r.addExt(LevelNote, KindNoLocal, xr, fmt.Sprintf("externalTrafficPolicy Local and no endpoint on node %s: connections from outside that arrive here are dropped (load balancers' health checks steer away from such nodes)", r.Node), ap.svcLine)
		}
	}
}

// addExt adds a finding about an external report.
func (r *Report) addExt(l Level, kind string, xr *ExternalReport, msg string, ev ...Line) {
	f := r.add(l, kind, nil, msg, ev...)
	f.Port = xr.Port + " (external)"
	if xr.Split != nil {
		f.Port = xr.Split.Label()
	}
}
