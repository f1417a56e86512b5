// Package proxy is the subject's kube-proxy logic that every backend shares:
// endpoint eligibility, written from kube-proxy's CategorizeEndpoints
// (pkg/proxy/topology.go, the version with PreferSameNode, about v1.33) and
// the traffic-policy predicates of its ServicePort, and the named faults
// (faults.go, faultlimits.go) the harness builds in to prove its checks
// catch a wrong dataplane. Every dataplane backend uses it, and so do the
// simulator's engines (sim/engine), which model the subject: one copy of
// kube-proxy's logic on the subject's side. The oracle (sim/oracle) has its
// own, independent reading of the documentation and never imports this
// package (design principle 1).
//
// The package is pure (no kernel, no netlink, no metrics), so that the
// simulator can import it without the dataplane's root package.
package proxy

import (
	"slices"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Topology modes chosen from the endpoints' hints, as kube-proxy names them
// (the Service trafficDistribution values).
const (
	TopologyNone           = ""
	TopologyPreferSameZone = "PreferSameZone"
	TopologyPreferSameNode = "PreferSameNode"
)

// Categorized is the outcome of endpoint eligibility for one service port on
// one node.
type Categorized struct {
	// Cluster are the endpoints for Cluster traffic policy: ready ones
	// (filtered by topology hints), else every serving and terminating one.
	// Empty when the service port never uses Cluster policy. In kube-proxy's
	// order (SortEndpoints), whatever the order of the input.
	Cluster []*cluster.Endpoint
	// Local are the endpoints on this node for Local traffic policy: ready
	// local ones, else serving and terminating local ones. Empty when the
	// service port never uses Local policy.
	Local []*cluster.Endpoint
	// AllReachable is the union of Cluster and Local: the endpoints that
	// need a chain of their own on this node. Sorted as Cluster and Local
	// are (SortEndpoints).
	AllReachable []*cluster.Endpoint
	// HasAny reports whether a usable endpoint exists anywhere in the
	// cluster (ready, or serving and terminating). When false, traffic is
	// rejected.
	HasAny bool
	// Topology is the topology mode in force ("" for none).
	Topology string
	// LocalTerminating reports that Local fell back to serving and
	// terminating endpoints.
	LocalTerminating bool
	// ExternalToCluster is the local-ignored fault in force: external
	// traffic goes to the Cluster set whatever its policy.
	ExternalToCluster bool
}

// Categorizer holds what eligibility depends on besides the endpoints: the
// node, its zone, the PreferSameNode feature gate and the two named faults
// that act on eligibility (FaultKeepNotReady and
// FaultIgnoreLocalPolicy; the other faults act in the backends).
type Categorizer struct {
	Node string
	Zone string
	// PreferSameNode is kube-proxy's PreferSameTrafficDistribution feature
	// gate (alpha, off by default, in v1.33): with it, node hints are
	// honoured before zone hints.
	PreferSameNode bool
	// KeepNotReady is the keep-not-ready fault: every endpoint looks ready
	// to the Cluster set.
	KeepNotReady bool
	// IgnoreLocalPolicy is the ignore-local-policy fault: every endpoint
	// looks local to the Local set.
	IgnoreLocalPolicy bool
	// LocalIgnored is the local-ignored fault: external traffic under
	// externalTrafficPolicy Local goes to the Cluster set.
	LocalIgnored bool
}

// Categorize splits a service port's endpoints for node (in zone) into the
// Cluster and Local sets, with no fault and the PreferSameNode gate off.
func Categorize(eps []*cluster.Endpoint, sp *cluster.ServicePort, node string, zone string) Categorized {
	return Categorizer{Node: node, Zone: zone}.Categorize(eps, sp)
}

// Categorize splits the endpoints of sp as kube-proxy's CategorizeEndpoints
// does: the Cluster set is ready endpoints available for the topology mode,
// falling back to every serving-and-terminating endpoint (topology ignored);
// the Local set is, independently, the ready local endpoints, falling back to
// serving-and-terminating local ones. Endpoints that are not serving are never
// used. The lists come out in kube-proxy's order (SortEndpoints); eps is not
// modified.
func (c Categorizer) Categorize(eps []*cluster.Endpoint, sp *cluster.ServicePort) Categorized {
	out := Categorized{ExternalToCluster: c.LocalIgnored}
	if !slices.IsSortedFunc(eps, CompareEndpoints) {
		eps = slices.Clone(eps)
		SortEndpoints(eps)
	}
	// clusterReady is readiness as the Cluster set sees it: the
	// keep-not-ready fault makes every endpoint look ready there.
	clusterReady := func(ep *cluster.Endpoint) bool {
		return ep.Ready || c.KeepNotReady
	}
	ready := func(ep *cluster.Endpoint) bool { return ep.Ready }
	local := func(ep *cluster.Endpoint) bool {
		return ep.NodeName == c.Node || c.IgnoreLocalPolicy
	}
	servingTerminating := func(ep *cluster.Endpoint) bool { return ep.Serving && ep.Terminating }

	if UsesClusterEndpoints(sp) {
		out.Topology = c.topologyMode(eps)
		out.Cluster = filter(eps, func(ep *cluster.Endpoint) bool {
			return clusterReady(ep) && availableForTopology(ep, out.Topology, c.Node, c.Zone)
		})
		// An empty result means there is no ready endpoint anywhere: the
		// topology mode is only chosen when a ready endpoint matches it.
		if len(out.Cluster) == 0 {
			out.Cluster = filter(eps, servingTerminating)
		}
		out.HasAny = len(out.Cluster) > 0
	}
	if !UsesLocalEndpoints(sp) {
		out.AllReachable = out.Cluster
		return out
	}

	var localReady, localST bool
	for _, ep := range eps {
		switch {
		case ready(ep):
			out.HasAny = true
			localReady = localReady || local(ep)
		case servingTerminating(ep):
			out.HasAny = true
			localST = localST || local(ep)
		}
	}
	switch {
	case localReady:
		out.Local = filter(eps, func(ep *cluster.Endpoint) bool { return local(ep) && ready(ep) })
	case localST:
		out.LocalTerminating = true
		out.Local = filter(eps, func(ep *cluster.Endpoint) bool { return local(ep) && servingTerminating(ep) })
	}
	switch {
	case !UsesClusterEndpoints(sp):
		out.AllReachable = out.Local
	case len(out.Local) == 0:
		out.AllReachable = out.Cluster
	default:
		out.AllReachable = union(out.Cluster, out.Local)
	}
	return out
}

// topologyMode is kube-proxy's topologyModeFromHints: only ready endpoints
// count; a mode applies when every one of them carries a hint of that kind
// and at least one hints this node (zone). There is no per-endpoint fallback.
func (c Categorizer) topologyMode(eps []*cluster.Endpoint) string {
	allNode, anyNode := true, false
	allZone, anyZone := true, false
	for _, ep := range eps {
		if !ep.Ready {
			continue
		}
		if len(ep.NodeHints) == 0 {
			allNode = false
		} else if slices.Contains(ep.NodeHints, c.Node) {
			anyNode = true
		}
		if len(ep.ZoneHints) == 0 {
			allZone = false
		} else if slices.Contains(ep.ZoneHints, c.Zone) {
			anyZone = true
		}
	}
	if c.PreferSameNode && allNode && anyNode {
		return TopologyPreferSameNode
	}
	if allZone && anyZone {
		return TopologyPreferSameZone
	}
	return TopologyNone
}

func availableForTopology(ep *cluster.Endpoint, mode, node, zone string) bool {
	switch mode {
	case TopologyPreferSameNode:
		return slices.Contains(ep.NodeHints, node)
	case TopologyPreferSameZone:
		return slices.Contains(ep.ZoneHints, zone)
	}
	return true
}

func filter(eps []*cluster.Endpoint, keep func(*cluster.Endpoint) bool) []*cluster.Endpoint {
	var out []*cluster.Endpoint
	for _, ep := range eps {
		if keep(ep) {
			out = append(out, ep)
		}
	}
	return out
}

// CompareEndpoints orders endpoints as kube-proxy's EndpointSliceCache does
// (byEndpoint in pkg/proxy/endpointslicecache.go): by their "ip:port" string,
// so "10.180.0.10:80" comes before "10.180.0.2:80". That order is the order of
// the probability rules in an iptables KUBE-SVC chain and of the numgen
// indexes in an nftables service chain.
func CompareEndpoints(a, b *cluster.Endpoint) int {
	return cluster.CompareEndpointStrings(a, b) // strings.Compare(a.String(), b.String()), without the strings
}

// SortEndpoints sorts eps in place by CompareEndpoints.
func SortEndpoints(eps []*cluster.Endpoint) { slices.SortFunc(eps, CompareEndpoints) }

// union merges two endpoint lists keyed by ip:port, sorted by
// CompareEndpoints (kube-proxy merges through a map and keeps no order; a
// stable order keeps rendered rules deterministic).
func union(a, b []*cluster.Endpoint) []*cluster.Endpoint {
	seen := make(map[string]bool, len(a)+len(b))
	out := make([]*cluster.Endpoint, 0, len(a)+len(b))
	for _, l := range [][]*cluster.Endpoint{a, b} {
		for _, ep := range l {
			if k := ep.String(); !seen[k] {
				seen[k] = true
				out = append(out, ep)
			}
		}
	}
	SortEndpoints(out)
	return out
}

// ExternallyAccessible reports whether the service port has destinations
// outside the cluster IP: a node port, load-balancer (VIP) IPs or external
// IPs (kube-proxy's BaseServicePortInfo.ExternallyAccessible).
func ExternallyAccessible(sp *cluster.ServicePort) bool {
	return sp.NodePort != 0 || len(sp.LoadBalancerIPs) > 0 || len(sp.ExternalIPs) > 0
}

// InternalPolicyLocal reports internalTrafficPolicy: Local.
func InternalPolicyLocal(sp *cluster.ServicePort) bool { return sp.InternalLocal }

// ExternalPolicyLocal reports externalTrafficPolicy: Local on an externally
// accessible service port.
func ExternalPolicyLocal(sp *cluster.ServicePort) bool {
	return sp.ExternalLocal && ExternallyAccessible(sp)
}

// UsesClusterEndpoints reports whether the service port ever sends traffic by
// Cluster policy: when the internal policy is Cluster, or when it accepts
// external traffic at all (even with external policy Local, pod and host
// traffic to external destinations is short-circuited to the Cluster chain).
func UsesClusterEndpoints(sp *cluster.ServicePort) bool {
	return !InternalPolicyLocal(sp) || ExternallyAccessible(sp)
}

// UsesLocalEndpoints reports whether the service port ever sends traffic by
// Local policy.
func UsesLocalEndpoints(sp *cluster.ServicePort) bool {
	return InternalPolicyLocal(sp) || ExternalPolicyLocal(sp)
}

// Internal returns the endpoints for traffic to the cluster IP: the Local set
// under internalTrafficPolicy Local, else the Cluster set. Empty with HasAny
// true means the traffic is dropped (no local endpoints); empty with HasAny
// false means it is rejected.
func (c Categorized) Internal(sp *cluster.ServicePort) []*cluster.Endpoint {
	if InternalPolicyLocal(sp) {
		return c.Local
	}
	return c.Cluster
}

// External returns the endpoints for traffic to the node port (and external
// destinations) that is not short-circuited: the Local set under
// externalTrafficPolicy Local, else the Cluster set.
func (c Categorized) External(sp *cluster.ServicePort) []*cluster.Endpoint {
	if ExternalPolicyLocal(sp) && !c.ExternalToCluster {
		return c.Local
	}
	return c.Cluster
}
