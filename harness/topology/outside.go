package topology

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Groups of the clients the topology adds for checks.
const (
	// GroupExternal is the outside client added when a check stands
	// outside the cluster and no traffic client does.
	GroupExternal = "external"
	// GroupRanges holds the outside addresses a source-ranges check needs
	// inside and outside its Service's ranges, when no other outside
	// client has them.
	GroupRanges = "ranges"
	// GroupHairpin are the endpoint pods of hairpin checks (one per node
	// with a ready endpoint of the checked Service).
	GroupHairpin = "hairpin"
)

// AcrossAddresses is how many addresses the added outside client holds
// when an external-affinity check runs: its verdict across entry nodes
// counts how many client addresses all nodes hold to one endpoint. One
// affinity state shared by the nodes (every address agrees) is told from
// per-node state at alpha 1e-5 while the nodes agree by chance with
// probability up to 0.6 (0.6^24 = 4.7e-6); the check uses the fewest
// addresses that reach its power (3 endpoints under Cluster agree with
// probability 1/3: 11 addresses).
const AcrossAddresses = 24

// placeOutside derives the world outside the cluster when the scenario
// needs one (an outside traffic client, or a check from outside): the
// router on the node network (its last address but one; the control plane
// of the kube-proxy subject takes the last), the gateway at the first
// address of the external network, and the outside clients with addresses
// from the external network upwards. A source-ranges check gets an address
// inside one of its Service's ranges and one outside all of them.
func placeOutside(cfg *netns.Config, st *cluster.State, o Options) error {
	ext := o.ExternalNetwork
	if !ext.IsValid() {
		ext = netip.MustParsePrefix(scenario.DefaultExternalNetwork)
	}
	ext = ext.Masked()
	groups := outsideGroups(o)
	if len(groups) == 0 {
		return nil
	}
	reserved := func(a netip.Addr) bool {
		if o.ServiceCIDR.IsValid() && o.ServiceCIDR.Contains(a) || o.NodeNetwork.IsValid() && o.NodeNetwork.Contains(a) {
			return true
		}
		for _, n := range cfg.Nodes {
			if n.PodCIDR.Contains(a) || n.Addr.Addr() == a {
				return true
			}
		}
		return false
	}
	used := map[netip.Addr]bool{}
	gw := ext.Addr().Next()
	if !ext.Contains(gw) || reserved(gw) {
		return fmt.Errorf("could not derive a topology: the external network %s has no address for the router's gateway", ext)
	}
	used[gw] = true
	// next finds a free address of p from its first host up, skipping
	// those skip refuses, at most 1<<16 tries.
	next := func(p netip.Prefix, skip func(netip.Addr) bool) (netip.Addr, bool) {
		a := p.Masked().Addr()
		if p.Bits() < 31 {
			a = a.Next()
		}
		for range 1 << 16 {
			if !p.Contains(a) {
				break
			}
			if !used[a] && !reserved(a) && (skip == nil || !skip(a)) && a != lastAddr(p) {
				used[a] = true
				return a, true
			}
			a = a.Next()
		}
		return netip.Addr{}, false
	}
	out := &netns.OutsideConfig{Gateway: gw}
	for _, g := range groups {
		for i := range max(g.PodsPerNode, 1) {
			cc := netns.ClientConfig{Group: g.Name, Index: i}
			for range max(g.SourceIPs, 1) {
				a, ok := next(ext, nil)
				if !ok {
					return fmt.Errorf("could not derive a topology: the external network %s has no address left for client %s (%d clients x %d source IPs); widen cluster.externalNetwork", ext, g.Name, max(g.PodsPerNode, 1), max(g.SourceIPs, 1))
				}
				cc.Addrs = append(cc.Addrs, a)
			}
			out.Clients = append(out.Clients, cc)
		}
	}
	// Source ranges: every Service a source-ranges check names needs an
	// outside address inside its ranges and one outside them.
	ranges := rangeAddresses(rangeChecks(st, o.Checks), out.Clients, ext, next)
	if len(ranges.Addrs) > 0 {
		out.Clients = append(out.Clients, ranges)
	}
	r, err := routerPrefix(cfg, o)
	if err != nil {
		return err
	}
	out.Router = r
	cfg.Outside = out
	return nil
}

// outsideGroups are the client groups standing outside the cluster: the
// traffic's, or when a check stands outside and the traffic has none, the
// added GroupExternal (with AcrossAddresses addresses when an
// external-affinity check runs). None: the run needs no outside world.
func outsideGroups(o Options) []scenario.Client {
	var groups []scenario.Client
	for _, c := range o.Clients {
		if c.Where == cluster.Outside {
			groups = append(groups, c)
		}
	}
	outsideCheck := false
	for i := range o.Checks {
		// A health check is sent from outside, as a load balancer's is.
		if from, _ := scenario.CheckRoute(&o.Checks[i]); from == cluster.Outside || o.Checks[i].Type == scenario.CheckHealthCheck {
			outsideCheck = true
		}
	}
	if len(groups) == 0 && !outsideCheck {
		return nil
	}
	if len(groups) == 0 {
		auto := scenario.Client{Name: GroupExternal}
		for i := range o.Checks {
			if o.Checks[i].Type == scenario.CheckExternalAffinity {
				// The verdict across entry nodes needs many clients.
				auto.SourceIPs = AcrossAddresses
			}
		}
		groups = append(groups, auto)
	}
	return groups
}

// routerPrefix is the router's address on the node network: its last host
// address but one (the control plane takes the last).
func routerPrefix(cfg *netns.Config, o Options) (netip.Prefix, error) {
	bits := 16
	if o.NodeNetwork.IsValid() {
		bits = o.NodeNetwork.Bits()
	}
	np := netip.PrefixFrom(cfg.Nodes[0].Addr.Addr(), bits).Masked()
	if o.NodeNetwork.IsValid() {
		np = o.NodeNetwork.Masked()
	}
	r := lastAddr(np).Prev().Prev() // the control plane takes the last host
	if !np.Contains(r) || slices.ContainsFunc(cfg.Nodes, func(n netns.NodeConfig) bool { return n.Addr.Addr() == r }) {
		return netip.Prefix{}, fmt.Errorf("could not derive a topology: the node network %s has no free address for the router", np)
	}
	return netip.PrefixFrom(r, np.Bits()), nil
}

// rangeAddresses are the addresses the source-ranges checks of sps still
// need beyond clients': for each Service, one inside its ranges and one
// outside them, from next (a free address of a prefix, skipping those
// skip refuses) and held by the client GroupRanges.
func rangeAddresses(sps []*cluster.ServicePort, clients []netns.ClientConfig, ext netip.Prefix, next func(netip.Prefix, func(netip.Addr) bool) (netip.Addr, bool)) netns.ClientConfig {
	have := func(pred func(netip.Addr) bool) bool {
		for _, c := range clients {
			if slices.ContainsFunc(c.Addrs, pred) {
				return true
			}
		}
		return false
	}
	var ranges netns.ClientConfig
	ranges.Group = GroupRanges
	for _, sp := range sps {
		in := func(a netip.Addr) bool { return inAny(sp.SourceRanges, a) }
		if !have(in) && !slices.ContainsFunc(ranges.Addrs, in) {
			for _, r := range sp.SourceRanges {
				if !r.Addr().Is4() {
					continue
				}
				p := r
				if p.Bits() < ext.Bits() && p.Contains(ext.Addr()) {
					p = ext // a wide range: its part in the external network
				}
				if a, ok := next(p, nil); ok {
					ranges.Addrs = append(ranges.Addrs, a)
					break
				}
			}
		}
		notIn := func(a netip.Addr) bool { return !in(a) }
		if !have(notIn) && !slices.ContainsFunc(ranges.Addrs, notIn) {
			if a, ok := next(ext, in); ok {
				ranges.Addrs = append(ranges.Addrs, a)
			}
		}
	}
	return ranges
}

// rangeChecks lists, once each and sorted, the service ports the
// source-ranges checks of checks name that have ranges.
func rangeChecks(st *cluster.State, checks []scenario.Check) []*cluster.ServicePort {
	seen := map[cluster.ServicePortName]*cluster.ServicePort{}
	for i := range checks {
		c := &checks[i]
		if c.Type != scenario.CheckSourceRanges {
			continue
		}
		spn, err := cluster.ResolvePort(c.Service, c.Port, maps.Keys(st.Services))
		if err != nil {
			continue
		}
		if sp := st.Services[spn]; sp != nil && len(sp.SourceRanges) > 0 {
			seen[spn] = sp
		}
	}
	var out []*cluster.ServicePort
	for _, spn := range slices.SortedFunc(maps.Keys(seen), func(a, b cluster.ServicePortName) int { return strings.Compare(a.String(), b.String()) }) {
		out = append(out, seen[spn])
	}
	return out
}

func inAny(ranges []netip.Prefix, a netip.Addr) bool {
	for _, r := range ranges {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

// lastAddr is p's broadcast address.
func lastAddr(p netip.Prefix) netip.Addr {
	return LastHost(p).Next()
}

// placeEndpointPods gives each hairpin check's Service, on every node, its
// first ready endpoint as a pod namespace of its own (group GroupHairpin),
// taken out of the node's backend namespace: the pod sends to its own
// Service, and what the choice sends back to it arrives there.
func placeEndpointPods(nodes []netns.NodeConfig, st *cluster.State, checks []scenario.Check) error {
	taken := map[netip.Addr]bool{}
	for i := range checks {
		c := &checks[i]
		if c.Type != scenario.CheckHairpin {
			continue
		}
		spn, err := cluster.ResolvePort(c.Service, c.Port, maps.Keys(st.Services))
		if err != nil {
			continue // validation reports it
		}
		for ni := range nodes {
			n := &nodes[ni]
			var pick netip.Addr
			for _, ep := range st.Endpoints[spn] {
				if ep.Ready && slices.Contains(n.Endpoints, ep.IP) && (!pick.IsValid() || ep.IP.Less(pick)) {
					pick = ep.IP
				}
			}
			if !pick.IsValid() || taken[pick] {
				continue
			}
			taken[pick] = true
			idx := 0
			for _, cl := range n.Clients {
				if cl.Group == GroupHairpin {
					idx++
				}
			}
			n.Endpoints = slices.DeleteFunc(n.Endpoints, func(a netip.Addr) bool { return a == pick })
			n.Clients = append(n.Clients, netns.ClientConfig{Group: GroupHairpin, Index: idx, Addrs: []netip.Addr{pick}, Endpoint: true})
		}
	}
	return nil
}
