package capacity

import (
	"net/netip"
	"slices"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
	"github.com/kpsim/kpsim/sim/engine"
)

// nodeCounts is one mode's per-node cost inputs at one size: the node with
// the most objects (the one whose syncs are slowest) and the median node.
type nodeCounts struct {
	worst, median cost.Counts
	worstNode     string
	// order is the worst node's service ports in KUBE-SERVICES order, for
	// the first-packet figures.
	order []cost.ServicePortInput
}

// countNodes renders every service port on every node in one mode, as
// sim/simulate's syncCosts does for a run's initial state, and counts each
// node's objects with cost.Count. A service port whose rules do not depend
// on the node (no internalTrafficPolicy Local, no topology hints) is
// rendered once.
func countNodes(mode cluster.Mode, st *cluster.State) (nodeCounts, error) {
	em, err := engine.ModeOf(mode)
	if err != nil {
		return nodeCounts{}, err
	}
	names := st.SortedServicePorts()
	nodes := st.SortedNodes()
	shared := make([]cost.ServicePortInput, len(names))
	var dep []int // indexes of node-dependent service ports
	ids := make([]*engine.Interner, len(names))
	for i, name := range names {
		sp, eps := st.Services[name], st.Endpoints[name]
		ids[i] = engine.NewInterner()
		if nodeDependent(sp, eps) {
			dep = append(dep, i)
			continue
		}
		r := engine.Render(em, sp, eps, "", "", ids[i], engine.RenderOptions{})
		shared[i] = r.CostInput(name)
		engine.AddExternal(&shared[i], em, sp, eps, "", "", netip.Addr{}, engine.RenderOptions{})
	}
	in := slices.Clone(shared)
	all := make([]cost.Counts, len(nodes))
	worst := -1
	var worstIn []cost.ServicePortInput
	eps := make([][]*cluster.Endpoint, len(names))
	for i, name := range names {
		eps[i] = st.Endpoints[name]
	}
	locals := cost.Locals(nodes, eps)
	cache := make([]nodeCache, len(dep))
	for k, i := range dep {
		cache[k] = newNodeCache(st.Services[names[i]], st.Endpoints[names[i]])
	}
	for ni, node := range nodes {
		zone, ip := st.Nodes[node].Zone, st.Nodes[node].IP
		for k, i := range dep {
			in[i] = cache[k].get(node, zone, func() cost.ServicePortInput {
				sp, eps := st.Services[names[i]], st.Endpoints[names[i]]
				r := engine.Render(em, sp, eps, node, zone, ids[i], engine.RenderOptions{})
				c := r.CostInput(names[i])
				engine.AddExternal(&c, em, sp, eps, node, zone, ip, engine.RenderOptions{})
				return c
			})
		}
		all[ni] = cost.CountOn(mode, in, locals[ni], true)
		if worst < 0 || all[ni].Objects > all[worst].Objects {
			worst = ni
			worstIn = slices.Clone(in)
		}
	}
	if len(nodes) == 0 {
		return nodeCounts{worst: cost.Count(mode, shared, true), median: cost.Count(mode, shared, true), order: shared}, nil
	}
	nc := nodeCounts{worst: all[worst], worstNode: nodes[worst], order: worstIn}
	sorted := slices.Clone(all)
	slices.SortFunc(sorted, func(a, b cost.Counts) int { return a.Objects - b.Objects })
	nc.median = sorted[len(sorted)/2]
	return nc, nil
}

// nodeCache holds a node-dependent service port's inputs by what its
// rendering can depend on: the node's name when an endpoint runs there or
// names it in a hint, else only the node's zone (zone hints). Nodes that
// host none of a Local Service's endpoints share one rendering per zone,
// which keeps a sweep at hundreds of nodes linear in the endpoints. A
// load-balancer IP's source ranges depend on the node's address
// (cost.External.FromNode): such a port is rendered per node.
type nodeCache struct {
	hosts   map[string]bool
	perNode bool
	seen    map[string]cost.ServicePortInput
}

func newNodeCache(sp *cluster.ServicePort, eps []*cluster.Endpoint) nodeCache {
	c := nodeCache{hosts: map[string]bool{}, seen: map[string]cost.ServicePortInput{}, perNode: sourceRanges(sp)}
	for _, e := range eps {
		c.hosts[e.NodeName] = true
		for _, h := range e.NodeHints {
			c.hosts[h] = true
		}
	}
	return c
}

func (c nodeCache) get(node, zone string, render func() cost.ServicePortInput) cost.ServicePortInput {
	key := "zone/" + zone
	if c.perNode || c.hosts[node] {
		key = "node/" + node
	}
	in, ok := c.seen[key]
	if !ok {
		in = render()
		c.seen[key] = in
	}
	return in
}

// nodeDependent: the port's rules differ between nodes: a Local traffic
// policy (internal, or external on a port reachable from outside), source
// ranges, or topology hints.
func nodeDependent(sp *cluster.ServicePort, eps []*cluster.Endpoint) bool {
	return sp.InternalLocal || sp.ExternalLocal && engine.HasExternal(sp) || sourceRanges(sp) || slices.ContainsFunc(eps, func(e *cluster.Endpoint) bool {
		return len(e.ZoneHints) > 0 || len(e.NodeHints) > 0
	})
}

// sourceRanges: load-balancer IPs with loadBalancerSourceRanges.
func sourceRanges(sp *cluster.ServicePort) bool {
	return len(sp.LoadBalancerIPs) > 0 && len(sp.SourceRanges) > 0
}
