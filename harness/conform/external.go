package conform

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/topology"
	"github.com/kpsim/kpsim/harness/traffic"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// target is where a check's probes go and what must become of them: the
// client that sends (a pod, a node's own namespace, or a machine outside
// the cluster; for one outside, a copy naming the entry node), its source
// addresses, the destination, the oracle's outcome for a client standing
// there, and the nodes whose rules decide the connections.
type target struct {
	client   *netns.Client
	sources  []netip.Addr
	dst      netip.AddrPort
	proto    traffic.Proto
	want     oracle.Outcome
	deciders []string
	// sourceCheck holds every arrival's source address against the
	// oracle's (Outcome.SourceOf): the client's own, or an address of a
	// deciding node (its node address or the gateway a masqueraded
	// connection leaves a node by toward a pod).
	sourceCheck bool
	nodeAddrs   map[netip.Addr]bool
	// sticky requires every arrival at one endpoint (ClientIP affinity
	// from one address).
	sticky bool
}

// deterministicTypes are the check types whose verdict is zero-tolerance
// on a fixed number of probes, whatever the number of endpoints: every
// probe must end where the oracle allows, from the source it states, or
// (affinity) at one endpoint.
var deterministicTypes = map[string]bool{
	scenario.CheckSourceAddress:    true,
	scenario.CheckExternalAffinity: true,
	scenario.CheckSourceRanges:     true,
	scenario.CheckServiceCIDR:      true,
}

// The phases of the two-sided checks.
const (
	phaseAllowed     = "from an allowed source"
	phaseDenied      = "from a denied source"
	phaseUnknownPort = "unknown port of the cluster IP"
	phaseUnallocated = "unallocated address of the service CIDR"
)

// target resolves where check c's probes go from node nodeName (the pod's
// or host's node, or the node a connection from outside enters at).
func (s *suite) target(c *scenario.Check, spn cluster.ServicePortName, sp *cluster.ServicePort, nodeName, phase string) (target, error) {
	st := s.state()
	from, via := scenario.CheckRoute(c)
	node := st.Nodes[nodeName]
	if node == nil {
		return target{}, fmt.Errorf("no node %s", nodeName)
	}
	t := target{proto: protoOf(sp), deciders: []string{nodeName}}
	switch {
	case c.Type == scenario.CheckHairpin:
		t.client = s.endpointPod(spn, nodeName)
		if t.client == nil {
			return t, fmt.Errorf("no endpoint pod of %s on node %s", spn, nodeName)
		}
		t.sourceCheck = true
	case from == cluster.InPod:
		t.client = s.clientOn(nodeName)
		if t.client == nil {
			return t, fmt.Errorf("no client pod on node %s", nodeName)
		}
	case from == cluster.OnHost:
		for _, h := range s.topo.Hosts() {
			if h.Node == nodeName {
				t.client = h
			}
		}
		if t.client == nil {
			return t, fmt.Errorf("no node namespace %s", nodeName)
		}
	case from == cluster.Outside:
		cl, addrs, err := s.outsideClient(c, sp, phase)
		if err != nil {
			return t, err
		}
		entry := *cl
		entry.Node = nodeName
		t.client, t.sources = &entry, addrs
	}
	if t.sources == nil {
		t.sources = t.client.Config.Addrs
	}
	std := cluster.Standpoint{Where: from, Node: nodeName, Addr: t.sources[0]}
	if c.Type == scenario.CheckHairpin {
		std.Where = cluster.InPod
	}
	dsts := sp.Destinations(via, node.IP)
	if len(dsts) == 0 {
		return t, fmt.Errorf("%s has no %s address", spn, via)
	}
	t.dst = dsts[0]
	t.want = s.or.ExpectFrom(s.o.Mode, sp, st.Endpoints[spn], std, via, node.Zone)
	switch c.Type {
	case scenario.CheckSourceAddress:
		t.sourceCheck = true
	case scenario.CheckExternalAffinity:
		t.sources, t.sticky = t.sources[:1], true
	case scenario.CheckServiceCIDR:
		if err := s.serviceCIDRTarget(&t, sp, phase); err != nil {
			return t, err
		}
	}
	if t.sourceCheck {
		t.nodeAddrs = s.nodeAddrs(nodeName)
	}
	if from == cluster.Outside && via != cluster.ViaNodePort {
		// The entry node is the one the router sends the address to.
		if err := s.topo.Route(netip.PrefixFrom(t.dst.Addr(), 32), []netip.Addr{node.IP}); err != nil {
			return t, &EnvironmentError{err}
		}
	}
	return t, nil
}

// nodeAddrs are the addresses a connection masqueraded by node leaves it
// with: its node address, and the gateway it reaches its pods by.
func (s *suite) nodeAddrs(nodes ...string) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	if s.topo == nil {
		return out
	}
	for _, name := range nodes {
		if n, ok := s.topo.Node(name); ok {
			out[n.Config.Addr.Addr()] = true
			out[n.Config.Gateway] = true
		}
	}
	return out
}

// endpointPod is the hairpin endpoint pod of spn's Service on node (one
// of topology.GroupHairpin holding an endpoint of spn), or nil.
func (s *suite) endpointPod(spn cluster.ServicePortName, node string) *netns.Client {
	eps := s.state().Endpoints[spn]
	for _, c := range s.topo.Clients() {
		if c.Node != node || !c.Config.Endpoint {
			continue
		}
		for _, e := range eps {
			if e.IP == c.Config.Addrs[0] {
				return c
			}
		}
	}
	return nil
}

// outsideClient picks the client outside the cluster a check sends from
// and its source addresses: for a source-ranges check, an address inside
// the Service's ranges (phaseAllowed) or outside them (phaseDenied),
// wherever the topology put it; otherwise the first outside client that is
// not the ranges' (topology.GroupRanges), all its addresses.
func (s *suite) outsideClient(c *scenario.Check, sp *cluster.ServicePort, phase string) (*netns.Client, []netip.Addr, error) {
	out := s.topo.Outside()
	if c.Type == scenario.CheckSourceRanges {
		in := phase == phaseAllowed
		for _, cl := range out {
			for _, a := range cl.Config.Addrs {
				inside := false
				for _, r := range sp.SourceRanges {
					inside = inside || r.Contains(a)
				}
				if inside == in {
					return cl, []netip.Addr{a}, nil
				}
			}
		}
		return nil, nil, fmt.Errorf("no address outside the cluster %s: the topology could not place one", phase)
	}
	for _, cl := range out {
		if cl.Config.Group != topology.GroupRanges {
			return cl, nil, nil
		}
	}
	return nil, nil, fmt.Errorf("no client outside the cluster")
}

// serviceCIDRTarget points t at a port of the cluster IP that no service
// port uses (rejected) or at an address of the service CIDR that no
// Service holds (dropped), as kube-proxy's nftables mode treats them.
func (s *suite) serviceCIDRTarget(t *target, sp *cluster.ServicePort, phase string) error {
	st := s.state()
	used := map[netip.AddrPort]bool{}
	ips := map[netip.Addr]bool{}
	for _, p := range st.Services {
		used[netip.AddrPortFrom(p.ClusterIP, uint16(p.Port))] = true
		ips[p.ClusterIP] = true
	}
	switch phase {
	case phaseUnknownPort:
		port := uint16(sp.Port)
		for i := 0; i < 1000 && used[netip.AddrPortFrom(sp.ClusterIP, port)]; i++ {
			port = port%65535 + 1
		}
		t.dst = netip.AddrPortFrom(sp.ClusterIP, port)
		t.want = oracle.Outcome{Kind: oracle.Reject, Reason: fmt.Sprintf("%s is a cluster IP without service port %d: rejected", sp.ClusterIP, port)}
	case phaseUnallocated:
		cidr, err := netip.ParsePrefix(s.l.Scenario.Cluster.ServiceCIDR)
		if err != nil {
			return fmt.Errorf("the scenario has no service CIDR: %w", err)
		}
		// The first address is every cluster's default/kubernetes Service
		// (the API server allocates it to itself), a scenario's or not.
		a := cidr.Masked().Addr().Next().Next()
		for i := 0; i < 1<<16 && cidr.Contains(a) && ips[a]; i++ {
			a = a.Next()
		}
		if !cidr.Contains(a) || ips[a] {
			return fmt.Errorf("every address of the service CIDR %s is allocated", cidr)
		}
		t.dst = netip.AddrPortFrom(a, uint16(sp.Port))
		t.want = oracle.Outcome{Kind: oracle.Drop, Reason: fmt.Sprintf("%s is in the service CIDR %s and no Service's: dropped", a, cidr)}
	default:
		return fmt.Errorf("service-cidr check without a phase")
	}
	return nil
}

// countersOf sums the rule counters of the deciding nodes (nil when one
// of them has none).
func (s *suite) countersOf(nodes []string) []dataplane.Counter {
	var out []dataplane.Counter
	for _, n := range nodes {
		c := s.mc.counters(n)
		if c == nil {
			return nil
		}
		out = append(out, c...)
	}
	return out
}

// judge adds the target's own zero-tolerance conditions to a decided
// check: every arrival from the source the oracle states, and one endpoint
// for a sticky client. A breach fails the check (p 0).
func (t target) judge(rc *report.Check, counts Counts) {
	if rc.Verdict == report.Error {
		return
	}
	var problems []string
	if t.sourceCheck {
		clients := map[netip.Addr]bool{}
		for _, a := range t.sources {
			clients[a] = true
		}
		wrong := map[string]int{}
		total := 0
		for k, v := range counts.Arrivals {
			want := t.want.SourceOf(k.Endpoint.String())
			ok := clients[k.Client]
			if want == oracle.SourceNode {
				ok = t.nodeAddrs[k.Client]
			}
			if !ok {
				wrong[fmt.Sprintf("%s saw %s (want the %s's)", k.Endpoint, k.Client, want)] += v
				total += v
			}
		}
		rc.Table = append(rc.Table, report.Row{Outcome: "wrong source address", Observed: float64(total)})
		for _, k := range slices.Sorted(maps.Keys(wrong)) {
			problems = append(problems, fmt.Sprintf("%s: %d", k, wrong[k]))
		}
	}
	if t.sticky {
		per := counts.PerEndpoint()
		if len(per) > 1 {
			var eps []string
			for e, n := range per {
				eps = append(eps, fmt.Sprintf("%s (%d)", e, n))
			}
			sort.Strings(eps)
			problems = append(problems, "one client address reached "+fmt.Sprint(len(per))+" endpoints: "+strings.Join(eps, ", "))
		}
	}
	if len(problems) > 0 {
		rc.Test, rc.P, rc.Statistic = "deterministic", 0, 1
		rc.Message = strings.TrimSpace(rc.Message + " " + strings.Join(problems, "; "))
	}
}

// localBalance is the external Local balance check: connections from
// outside to the load-balancer IP, spread over the nodes by an ECMP route
// in the router (a layer-4 hash) that follows the health checks as a cloud
// load balancer does (only nodes whose health check node port answers 200),
// held against ExpectBalanced: each pod's share is 1/(nodes with a local
// endpoint) x 1/(local endpoints on its node). No connection may be lost.
// The report states the imbalance: the busiest pod's share over the
// idlest's, expected and observed.
func (s *suite) localBalance(ctx context.Context, c *scenario.Check) {
	start := s.mc.now()
	rc := &report.Check{Name: c.Name, Type: c.Type, Service: c.Service, Seed: s.seed, Alpha: s.alphaUnit, MDE: c.MDE, Power: c.Power}
	defer func() { rc.Duration = s.mc.now() - start; s.out.Checks = append(s.out.Checks, rc) }()
	spn, sp, err := s.spn(c)
	if err != nil {
		rc.Verdict, rc.Message = report.Error, err.Error()
		return
	}
	st := s.state()
	nodes := st.SortedNodes()
	answers, err := s.healthAnswers(ctx, sp)
	if err != nil {
		rc.Verdict, rc.Message = report.Error, err.Error()
		return
	}
	var via []netip.Addr
	var healthy []string
	for _, n := range nodes {
		if answers[n].Status == 200 {
			via = append(via, st.Nodes[n].IP)
			healthy = append(healthy, n)
		}
	}
	if len(via) == 0 {
		for _, n := range nodes {
			via = append(via, st.Nodes[n].IP) // none healthy: every node, as cloud balancers do
		}
	}
	dsts := sp.Destinations(cluster.ViaLoadBalancer, netip.Addr{})
	if len(dsts) == 0 {
		rc.Verdict, rc.Message = report.Error, spn.String()+" has no load-balancer IP"
		return
	}
	if err := s.topo.Route(netip.PrefixFrom(dsts[0].Addr(), 32), via); err != nil {
		rc.Verdict, rc.Message, rc.ErrorKind = report.Error, err.Error(), report.KindEnvironment
		return
	}
	cl, _, err := s.outsideClient(c, sp, "")
	if err != nil {
		rc.Verdict, rc.Message = report.Error, err.Error()
		return
	}
	zones := map[string]string{}
	for _, n := range nodes {
		zones[n] = st.Nodes[n].Zone
	}
	want, drop := s.or.ExpectBalanced(s.o.Mode, sp, st.Endpoints[spn], nodes, zones, cl.Config.Addrs[0], true)
	if drop > 0 {
		// The balancer follows the health checks: a node it still uses
		// without a local endpoint loses connections, which this check
		// forbids (the DROP cell has probability 0).
		want.Reason += fmt.Sprintf("; %.3g of the connections would be lost on nodes without a local endpoint", drop)
	}
	entry := *cl
	entry.Node = "" // the balancer picks the node
	t := target{client: &entry, sources: cl.Config.Addrs, dst: dsts[0], proto: protoOf(sp), want: want, deciders: nodes}
	rc.Message = "balancer over " + strings.Join(healthy, ", ") + " (health checks); "
	s.sampleTarget(ctx, c, rc, spn, t)
	if want.Kind == oracle.Endpoints && rc.Verdict != report.Error {
		exp, obs := imbalance(rc.Table, want)
		rc.Message = strings.TrimSpace(rc.Message + fmt.Sprintf(" busiest/idlest pod: expected %.3g, observed %.3g", exp, obs))
	}
}

// imbalance is the ratio of the busiest endpoint's share to the idlest's,
// expected and observed, over the table's endpoint rows.
func imbalance(rows []report.Row, want oracle.Outcome) (expected, observed float64) {
	var lo, hi, olo, ohi float64
	first := true
	for _, r := range rows {
		p, ok := want.Probs[r.Outcome]
		if !ok {
			continue
		}
		if first {
			lo, hi, olo, ohi, first = p, p, r.Observed, r.Observed, false
			continue
		}
		lo, hi = min(lo, p), max(hi, p)
		olo, ohi = min(olo, r.Observed), max(ohi, r.Observed)
	}
	expected = hi / lo
	observed = ohi / max(olo, 1)
	return expected, observed
}

// healthAnswers asks every node's health check node port for sp's Service
// from the router's namespace, as a load balancer's health checker does.
func (s *suite) healthAnswers(ctx context.Context, sp *cluster.ServicePort) (map[string]dataplane.HealthAnswer, error) {
	r := s.topo.Router()
	if r == nil {
		return nil, fmt.Errorf("the topology has no router to send health checks from")
	}
	if sp.HealthCheckNodePort == 0 {
		return nil, fmt.Errorf("%s has no health check node port", sp.Name)
	}
	out := map[string]dataplane.HealthAnswer{}
	st := s.state()
	for _, n := range st.SortedNodes() {
		out[n] = dataplane.AskHealth(ctx, r.Do, netip.AddrPortFrom(st.Nodes[n].IP, uint16(sp.HealthCheckNodePort)), "/")
	}
	return out, nil
}

// healthCheck asks every node's health check node port for the check's
// Service and holds each answer against ExpectHealthCheck (over every port
// of the Service): 200 and the count of the node's ready endpoints where it
// has one, 503 elsewhere. Zero tolerance: one wrong answer fails.
func (s *suite) healthCheck(ctx context.Context, c *scenario.Check, phase string) {
	start := s.mc.now()
	rc := &report.Check{Name: c.Name, Type: c.Type, Service: c.Service, Phase: phase, Seed: s.seed, Alpha: s.alphaUnit, Test: "deterministic"}
	if phase != "" {
		rc.Name += " / " + phase
	}
	defer func() { rc.Duration = s.mc.now() - start; s.out.Checks = append(s.out.Checks, rc) }()
	if _, err := s.kernelOnly("a health check"); err != nil {
		rc.Verdict, rc.Message = report.Error, err.Error()
		return
	}
	spn, sp, err := s.spn(c)
	if err != nil {
		rc.Verdict, rc.Message = report.Error, err.Error()
		return
	}
	st := s.state()
	var byPort [][]*cluster.Endpoint
	for n, eps := range st.Endpoints {
		if n.NamespacedName == spn.NamespacedName {
			byPort = append(byPort, eps)
		}
	}
	answers, err := s.healthAnswers(ctx, sp)
	if err != nil {
		rc.Verdict, rc.Message = report.Error, err.Error()
		return
	}
	var wrong []string
	for _, n := range st.SortedNodes() {
		want := oracle.ExpectHealthCheck(byPort, n)
		got := answers[n]
		row := report.Row{Outcome: n + ": " + got.Summary(), Observed: 1, Expected: 0}
		if got.Err == nil && got.Status == want.Status && got.LocalEndpoints == want.LocalEndpoints {
			row.Expected = 1
		} else {
			msg := fmt.Sprintf("%s answered %s, want %d localEndpoints %d", n, got.Summary(), want.Status, want.LocalEndpoints)
			if got.Err != nil {
				msg += " (" + got.Err.Error() + ")"
			}
			wrong = append(wrong, msg)
		}
		rc.Table = append(rc.Table, row)
		rc.N++
	}
	rc.P, rc.Verdict = 1, report.Pass
	rc.Message = fmt.Sprintf("%d nodes answered as kube-proxy's health check must", rc.N)
	if len(wrong) > 0 {
		rc.P, rc.Statistic = 0, float64(len(wrong))
		rc.Message = strings.Join(wrong, "; ")
	}
}
