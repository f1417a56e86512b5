package engine

// Render turns a service port and its endpoints into the rules one node
// programs. Endpoint eligibility is the subject's own: dataplane/proxy's
// Categorizer, the code every dataplane backend runs (kube-proxy's
// CategorizeEndpoints: cluster endpoints are the ready ones, filtered by
// topology hints when every ready endpoint has them and one matches this
// node, else every serving-and-terminating one; local endpoints are this
// node's ready ones, else its serving-and-terminating ones; the Cluster set
// is computed only when the service port uses it, UsesClusterEndpoints).
// The oracle, in sim/oracle, reads the documentation on its own; tests hold
// the two against each other. What each mode then does with the sets
// follows kube-proxy's proxiers:
//
//   - iptables and nftables (proxier.go): internalTrafficPolicy Local uses
//     the local endpoints; no usable endpoint anywhere → REJECT; Local with
//     no local endpoint → DROP;
//   - ipvs (syncEndpoint): Local uses the local endpoints but falls back to
//     the cluster ones when there is none (kubernetes PR #97081); a virtual
//     server without real servers rejects. For a service port that is not
//     reachable from outside (no node port) with internalTrafficPolicy
//     Local the Cluster set is empty, so the fallback is empty and ipvs
//     rejects.
//
// Endpoints are ordered by their "ip:port" string, as kube-proxy's
// EndpointSliceCache sorts them (byEndpoint).

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

// RenderOptions are the kube-proxy settings that change endpoint selection.
type RenderOptions struct {
	// PreferSameNode enables node hints (feature gate
	// PreferSameTrafficDistribution); zone hints are always honoured.
	PreferSameNode bool
}

func categorize(sp *cluster.ServicePort, eps []*cluster.Endpoint, nodeName, nodeZone string, opts RenderOptions) proxy.Categorized {
	return proxy.Categorizer{Node: nodeName, Zone: nodeZone, PreferSameNode: opts.PreferSameNode}.Categorize(eps, sp)
}

// Render returns the rules a node programs for traffic from pods (and the
// host) to a service port's ClusterIP.
func Render(mode Mode, sp *cluster.ServicePort, eps []*cluster.Endpoint, nodeName, nodeZone string, ids *Interner, opts RenderOptions) Rules {
	cat := categorize(sp, eps, nodeName, nodeZone, opts)
	r := baseRules(sp)
	name := sp.Name.String()
	chain := cat.Internal(sp)
	switch mode {
	case IPVS:
		if proxy.InternalPolicyLocal(sp) && len(cat.Local) == 0 {
			chain = cat.Cluster
		}
		if len(chain) == 0 {
			r.Verdict, r.Reason = Reject, name+" has no endpoints"
			return r
		}
	default:
		if !cat.HasAny {
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
// back to the cluster endpoints without masquerade: they get the
// connection, its replies never reach the client (Reason says so). It is
// meaningful only
// for a service port reachable from outside (proxy.ExternallyAccessible).
func RenderExternal(mode Mode, sp *cluster.ServicePort, eps []*cluster.Endpoint, nodeName, nodeZone string, ids *Interner, opts RenderOptions) Rules {
	cat := categorize(sp, eps, nodeName, nodeZone, opts)
	r := baseRules(sp)
	name := sp.Name.String()
	chain := cat.External(sp)
	switch {
	case !cat.HasAny:
		r.Verdict, r.Reason = Reject, name+" has no endpoints"
	case len(chain) == 0 && mode == IPVS:
		// syncEndpoint's fallback (kubernetes PR #97081): the cluster's
		// endpoints get the connection without SNAT, and their replies
		// never reach the client.
		if r.Backends = backends(cat.Cluster, ids); len(r.Backends) == 0 {
			r.Verdict, r.Reason = Reject, name+" has no endpoints"
		} else {
			r.Reason = name + " has no local endpoints: ipvs forwards to the cluster's endpoints without SNAT, and their replies are lost"
		}
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
	slices.SortFunc(sorted, cluster.CompareEndpointStrings)
	out := make([]Backend, len(sorted))
	for i, e := range sorted {
		ap := netip.AddrPortFrom(e.IP, uint16(e.Port))
		out[i] = Backend{ID: ids.ID(ap), IP: IPv4(e.IP), Port: uint16(e.Port)}
	}
	return out
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
