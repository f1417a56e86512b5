package proxy

import "github.com/kpsim/kpsim/sim/cluster"

// Roles are kube-proxy's per-service-port role flags, the booleans its
// syncProxyRules derives for each service port before writing any rule
// (pkg/proxy/iptables/proxier.go: hasEndpoints, hasInternalEndpoints,
// usesLocalEndpoints, ...; the nftables proxier repeats them). Every backend
// takes them from Categorized.Roles, so they are derived once.
type Roles struct {
	// External: the service port is reachable from outside (a node port).
	External bool
	// InternalLocal is internalTrafficPolicy Local.
	InternalLocal bool
	// ExternalLocal is externalTrafficPolicy Local on an externally
	// accessible service port.
	ExternalLocal bool
	// HasEndpoints: some endpoint may receive traffic (Categorized.HasAny);
	// without one, traffic is rejected.
	HasEndpoints bool
	// HasInternal: cluster-IP traffic has an endpoint to go to. With
	// HasEndpoints and not HasInternal, it is dropped (Local policy, no
	// local endpoint).
	HasInternal bool
	// HasExternal: external traffic has an endpoint to go to, likewise
	// (read only when External).
	HasExternal bool
	// ExternalToLocal: external traffic that is not short-circuited goes
	// to the Local set (externalTrafficPolicy Local; not under the
	// local-ignored fault, which sends it to the Cluster set).
	ExternalToLocal bool
	// UsesClusterChain: the Cluster set is used (kube-proxy's KUBE-SVC-
	// chain is written).
	UsesClusterChain bool
	// UsesLocalChain: the Local set is used (KUBE-SVL-).
	UsesLocalChain bool
	// UsesExtChain: the external chain is written (KUBE-EXT-): whenever an
	// externally accessible service port has endpoints at all, since its
	// short-circuit rules apply even without local endpoints.
	UsesExtChain bool
	// NoLocalInternal and NoLocalExternal are HasEndpoints without
	// HasInternal (HasExternal): kube-proxy's no-local-endpoints counters.
	NoLocalInternal, NoLocalExternal bool
}

// Roles derives the role flags of sp from its categorized endpoints.
func (c Categorized) Roles(sp *cluster.ServicePort) Roles {
	r := Roles{
		External:      ExternallyAccessible(sp),
		InternalLocal: InternalPolicyLocal(sp),
		ExternalLocal: ExternalPolicyLocal(sp),
		HasEndpoints:  c.HasAny,
	}
	r.HasInternal = r.HasEndpoints && !(r.InternalLocal && len(c.Local) == 0)
	r.ExternalToLocal = r.ExternalLocal && !c.ExternalToCluster
	r.HasExternal = r.HasEndpoints && !(r.ExternalToLocal && len(c.Local) == 0)
	r.UsesClusterChain = len(c.Cluster) > 0 && UsesClusterEndpoints(sp)
	r.UsesLocalChain = len(c.Local) > 0 && UsesLocalEndpoints(sp)
	r.UsesExtChain = r.HasEndpoints && r.External
	r.NoLocalInternal = r.HasEndpoints && !r.HasInternal
	r.NoLocalExternal = r.HasEndpoints && r.External && !r.HasExternal
	return r
}
