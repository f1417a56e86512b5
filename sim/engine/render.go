package engine

// Render turns a service port and its endpoints into the rules one node
// programs, following kube-proxy's code rather than the documentation (the
// oracle, in sim/oracle, follows the documentation; tests hold them
// against each other):
//
//   - pkg/proxy/topology.go CategorizeEndpoints: cluster endpoints are the
//     ready ones (filtered by topology hints when every ready endpoint has
//     them and one matches this node), else every serving-and-terminating
//     one; local endpoints are this node's ready ones, else its
//     serving-and-terminating ones; hasAnyEndpoints says whether any
//     endpoint is usable at all;
//   - iptables and nftables (proxier.go): internalTrafficPolicy Local uses
//     the local endpoints; no usable endpoint anywhere → REJECT; Local with
//     no local endpoint → DROP;
//   - ipvs (syncEndpoint): Local uses the local endpoints but falls back to
//     the cluster ones when there is none (kubernetes PR #97081); a virtual
//     server without real servers rejects. CategorizeEndpoints computes
//     cluster endpoints only when the service port uses them
//     (UsesClusterEndpoints: internal policy Cluster, or externally
//     accessible), so for a plain ClusterIP Service with
//     internalTrafficPolicy Local the fallback is empty and ipvs rejects.
//
// Endpoints are ordered by their "ip:port" string, as kube-proxy's
// EndpointSliceCache sorts them (byEndpoint).

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/sim/cluster"
)

// RenderOptions are the kube-proxy settings that change endpoint selection.
type RenderOptions struct {
	// PreferSameNode enables node hints (feature gate
	// PreferSameTrafficDistribution); zone hints are always honoured.
	PreferSameNode bool
}

// Render returns the rules a node programs for traffic from pods (and the
// host) to a service port's ClusterIP.
func Render(mode Mode, sp *cluster.ServicePort, eps []*cluster.Endpoint, nodeName, nodeZone string, ids *Interner, opts RenderOptions) Rules {
	clusterEps, localEps, hasAny := categorize(sp, eps, nodeName, nodeZone, opts)
	r := baseRules(sp)
	name := sp.Name.String()
	chain := clusterEps
	if sp.InternalLocal {
		chain = localEps
	}
	switch mode {
	case IPVS:
		if sp.InternalLocal && len(localEps) == 0 {
			chain = clusterEps
		}
		if len(chain) == 0 {
			r.Verdict, r.Reason = Reject, name+" has no endpoints"
			return r
		}
	default:
		if !hasAny {
			r.Verdict, r.Reason = Reject, name+" has no endpoints"
			return r
		}
		if len(chain) == 0 {
			r.Verdict, r.Reason = Drop, name+" has no local endpoints"
			return r
		}
	}
	r.Backends = backends(chain, ids)
	return r
}

// RenderExternal returns the rules for traffic from outside the cluster to
// a NodePort or LoadBalancer service port arriving at this node
// (externalTrafficPolicy). In IPVS mode, Local with no local endpoint falls
// back to the cluster endpoints without masquerade, so replies never reach
// the client: it is rendered as DROP with that reason.
func RenderExternal(mode Mode, sp *cluster.ServicePort, eps []*cluster.Endpoint, nodeName, nodeZone string, ids *Interner, opts RenderOptions) Rules {
	clusterEps, localEps, hasAny := categorize(sp, eps, nodeName, nodeZone, opts)
	r := baseRules(sp)
	name := sp.Name.String()
	chain := clusterEps
	if sp.ExternalLocal {
		chain = localEps
	}
	switch {
	case !hasAny:
		r.Verdict, r.Reason = Reject, name+" has no endpoints"
	case len(chain) == 0 && mode == IPVS:
		r.Verdict, r.Reason = Drop, name+" has no local endpoints (ipvs forwards to cluster endpoints without SNAT; replies are lost)"
	case len(chain) == 0:
		r.Verdict, r.Reason = Drop, name+" has no local endpoints"
	default:
		r.Backends = backends(chain, ids)
	}
	return r
}

func baseRules(sp *cluster.ServicePort) Rules {
	r := Rules{Verdict: Accept, Proto: protoOf(sp.Name.Protocol), VIP: IPv4(sp.ClusterIP), VPort: uint16(sp.Port)}
	if sp.ClientIPAffinity {
		r.AffinityTimeout = time.Duration(sp.AffinityTimeout) * time.Second
	}
	return r
}

func protoOf(p corev1.Protocol) Proto {
	switch p {
	case corev1.ProtocolUDP:
		return UDP
	case corev1.ProtocolSCTP:
		return SCTP
	}
	return TCP
}

func backends(eps []*cluster.Endpoint, ids *Interner) []Backend {
	sorted := slices.Clone(eps)
	slices.SortFunc(sorted, func(a, b *cluster.Endpoint) int { return cmp.Compare(a.String(), b.String()) })
	out := make([]Backend, len(sorted))
	for i, e := range sorted {
		ap := netip.AddrPortFrom(e.IP, uint16(e.Port))
		out[i] = Backend{ID: ids.ID(ap), IP: IPv4(e.IP), Port: uint16(e.Port)}
	}
	return out
}

// externallyAccessible is ServicePort.ExternallyAccessible: a node port, a
// load balancer (or external IPs, which ServicePort does not carry).
func externallyAccessible(sp *cluster.ServicePort) bool {
	return sp.NodePort != 0 || sp.Type == corev1.ServiceTypeNodePort || sp.Type == corev1.ServiceTypeLoadBalancer
}

// categorize is CategorizeEndpoints.
func categorize(sp *cluster.ServicePort, eps []*cluster.Endpoint, nodeName, nodeZone string, opts RenderOptions) (clusterEps, localEps []*cluster.Endpoint, hasAny bool) {
	// UsesClusterEndpoints: "Even if the external traffic policy is Local,
	// we need Cluster endpoints to implement short circuiting."
	usesCluster := !sp.InternalLocal || externallyAccessible(sp)
	usesLocal := sp.InternalLocal || (externallyAccessible(sp) && sp.ExternalLocal)
	if usesCluster {
		mode := topologyMode(eps, nodeName, nodeZone, opts)
		for _, ep := range eps {
			if ep.Ready && availableForTopology(ep, mode, nodeName, nodeZone) {
				clusterEps = append(clusterEps, ep)
			}
		}
		if len(clusterEps) == 0 {
			for _, ep := range eps {
				if ep.Serving && ep.Terminating {
					clusterEps = append(clusterEps, ep)
				}
			}
		}
		hasAny = len(clusterEps) > 0
	}
	if !usesLocal {
		return clusterEps, nil, hasAny
	}
	var localReady, localServingTerminating bool
	for _, ep := range eps {
		local := ep.NodeName != "" && ep.NodeName == nodeName
		if ep.Ready {
			hasAny = true
			localReady = localReady || local
		} else if ep.Serving && ep.Terminating {
			hasAny = true
			localServingTerminating = localServingTerminating || local
		}
	}
	for _, ep := range eps {
		if ep.NodeName == "" || ep.NodeName != nodeName {
			continue
		}
		if (localReady && ep.Ready) || (!localReady && localServingTerminating && ep.Serving && ep.Terminating) {
			localEps = append(localEps, ep)
		}
	}
	return clusterEps, localEps, hasAny
}

const (
	topoNone = iota
	topoSameZone
	topoSameNode
)

// topologyMode is topologyModeFromHints: it looks at ready endpoints only,
// and uses hints only when every one of them has some.
func topologyMode(eps []*cluster.Endpoint, nodeName, nodeZone string, opts RenderOptions) int {
	hasNode, allNode := false, true
	hasZone, allZone := false, true
	ready := 0
	for _, ep := range eps {
		if !ep.Ready {
			continue
		}
		ready++
		if len(ep.NodeHints) == 0 {
			allNode = false
		} else if slices.Contains(ep.NodeHints, nodeName) {
			hasNode = true
		}
		if len(ep.ZoneHints) == 0 {
			allZone = false
		} else if nodeZone != "" && slices.Contains(ep.ZoneHints, nodeZone) {
			hasZone = true
		}
	}
	switch {
	case ready == 0:
		return topoNone
	case opts.PreferSameNode && allNode && hasNode:
		return topoSameNode
	case allZone && hasZone:
		return topoSameZone
	}
	return topoNone
}

func availableForTopology(ep *cluster.Endpoint, mode int, nodeName, nodeZone string) bool {
	switch mode {
	case topoSameNode:
		return slices.Contains(ep.NodeHints, nodeName)
	case topoSameZone:
		return slices.Contains(ep.ZoneHints, nodeZone)
	}
	return true
}

// String describes rules in one line, for logs and golden files.
func (r Rules) String() string {
	if r.Verdict != Accept {
		return fmt.Sprintf("%s (%s)", r.Verdict, r.Reason)
	}
	s := ""
	for i, b := range r.Backends {
		if i > 0 {
			s += ", "
		}
		s += netip.AddrPortFrom(AddrFromIPv4(b.IP), b.Port).String()
	}
	return s
}
