package engine

import (
	"net/netip"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
)

// CostInput describes a node's rules for one service port to the cost
// model: its verdict, or its endpoints (every one reachable) and affinity.
// A service port reachable from outside needs AddExternal too.
func (r *Rules) CostInput(name cluster.ServicePortName) cost.ServicePortInput {
	in := cost.ServicePortInput{Name: name}
	switch r.Verdict {
	case Reject:
		in.Reject = true
	case Drop:
		in.Drop = true
	default:
		in.Endpoints = len(r.Backends)
		in.Reachable = len(r.Backends)
		in.Affinity = r.AffinityTimeout > 0
	}
	return in
}

// HasExternal reports that a service port has objects for traffic from
// outside the cluster (AddExternal has something to add): a node port,
// external or load-balancer IPs, or a health-check node port.
func HasExternal(sp *cluster.ServicePort) bool {
	return proxy.ExternallyAccessible(sp) || sp.HealthCheckNodePort != 0
}

// AddExternal adds to in, a service port's CostInput on a node in a mode,
// its destinations from outside the cluster (cost.External), with the
// endpoint sets the subject's Categorizer gives on that node, as Render and
// RenderExternal choose them: the external policy chain's endpoints
// (IPVS: with syncEndpoint's fallback to the cluster's), the second policy
// chain the service port writes besides the cluster-IP one, and every
// endpoint chain of both (in.Reachable). nodeIP is the node's address
// (the zero Addr when unknown: no source range is taken to hold it).
func AddExternal(in *cost.ServicePortInput, mode Mode, sp *cluster.ServicePort, eps []*cluster.Endpoint, nodeName, nodeZone string, nodeIP netip.Addr, opts RenderOptions) {
	if !HasExternal(sp) {
		return
	}
	x := cost.External{
		NodePort: sp.NodePort != 0, HealthCheckNodePort: sp.HealthCheckNodePort != 0,
		ExternalIPs: len(sp.ExternalIPs), LoadBalancerIPs: len(sp.LoadBalancerIPs), SourceRanges: len(sp.SourceRanges),
		Local: proxy.ExternalPolicyLocal(sp), NodeIPs: 1,
	}
	x.SameChain = x.Local == proxy.InternalPolicyLocal(sp)
	for _, p := range sp.SourceRanges {
		x.FromNode = x.FromNode || nodeIP.IsValid() && p.Contains(nodeIP)
	}
	cat := categorize(sp, eps, nodeName, nodeZone, opts)
	ext := cat.External(sp)
	if mode == IPVS {
		if len(ext) == 0 {
			ext = cat.Cluster
		}
		x.Endpoints = len(ext)
		in.External = x
		return
	}
	x.Endpoints = len(ext)
	r := cat.Roles(sp)
	switch {
	case r.InternalLocal && r.UsesClusterChain:
		x.OtherChain = len(cat.Cluster)
	case !r.InternalLocal && r.UsesLocalChain:
		x.OtherChain = len(cat.Local)
	}
	in.Reachable = len(cat.AllReachable)
	in.External = x
}
