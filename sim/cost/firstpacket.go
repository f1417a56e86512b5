package cost

// The rules the first packet of a new connection walks before its DNAT:
// kube-proxy's own chains on the way, from its dispatch chain (iptables
// and IPVS: nat KUBE-SERVICES; nftables: firewall-check, hooked before
// DNAT, then services) to the endpoint's DNAT, counting every rule
// evaluated, matched or not (a verdict-map or ipset lookup is one rule,
// the IPVS virtual-server lookup one more). The built-in chains' jumps
// into kube-proxy's are left out, and so are the filter chains after
// DNAT. Rejected and dropped traffic is counted to the end of the nat
// walk (its REJECT or DROP is in filter).

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Path is the destination a new connection is sent to.
type Path uint8

const (
	PathClusterIP Path = iota
	PathNodePort
	PathExternalIP
	PathLoadBalancer
)

// Weights are the new connections per service port (an index in the
// inputs of FirstPackets) by path; a nil slice: none took that path. An
// external-IP or load-balancer weight is spread evenly over the service
// port's addresses.
type Weights struct{ ClusterIP, NodePort, ExternalIP, LoadBalancer []float64 }

// PathWalk is the rules the first packets of one path walk, quantiles
// weighted by connections.
type PathWalk struct {
	RulesP50 float64 `json:"rulesP50"`
	RulesP99 float64 `json:"rulesP99"`
}

// FirstPacket is the work the first packet of a new connection does.
type FirstPacket struct {
	// RulesP50/P99 are rules evaluated over every path, weighted by
	// connections.
	RulesP50 float64 `json:"rulesP50"`
	RulesP99 float64 `json:"rulesP99"`
	// ClusterIP, NodePort and LoadBalancer (load-balancer and external
	// IPs) are the same by path; nil when no connection took it.
	ClusterIP    *PathWalk `json:"clusterIP,omitempty"`
	NodePort     *PathWalk `json:"nodePort,omitempty"`
	LoadBalancer *PathWalk `json:"loadBalancer,omitempty"`
	Note         string    `json:"note"`
}

// walker gives the rules walked to a service port through a path; addr
// is the external or load-balancer IP's index. next moves past a port
// (the inputs are walked in order, as KUBE-SERVICES holds them).
type walker interface {
	walk(s *ServicePortInput, p Path, addr int) float64
	next(s *ServicePortInput)
}

// FirstPackets computes the rules first packets walk in a mode, over the
// node's service ports in (in KUBE-SERVICES order: service-port name
// order, as dataplane/ renders it), weighted by w. A nil w spreads
// connections evenly: one for each cluster IP, node port, external IP and
// load-balancer IP with endpoints to reach. masquerade says that a pod
// CIDR is known (Count).
func FirstPackets(mode cluster.Mode, in []ServicePortInput, w *Weights, masquerade bool) FirstPacket {
	var wk walker
	var note string
	switch mode {
	case cluster.ModeIPTables:
		wk, note = newIPTablesWalker(in, masquerade), iptablesWalkNote
	case cluster.ModeNFTables:
		wk, note = nftWalker{masq: masquerade}, nftablesWalkNote
	case cluster.ModeIPVS:
		l := &ipvsLayout{}
		for i := range in {
			l.note(&in[i])
		}
		wk, note = ipvsWalker{l}, ipvsWalkNote
	default:
		return FirstPacket{}
	}
	var by [3][]walkWeight // cluster IP, node port, load balancer and external IP
	for i := range in {
		s := &in[i]
		x := &s.External
		// add puts each of a path's addrs destinations in group g with
		// weight: one per destination with endpoints when w is nil, else the
		// port's connections on the path spread evenly over them.
		add := func(g int, p Path, addrs int, reachable bool) {
			weight := float64(b2i(reachable))
			if w != nil {
				ws := pathWeights(w, p)
				if ws == nil || addrs == 0 {
					return
				}
				weight = ws[i] / float64(addrs)
			}
			for a := range addrs {
				if weight > 0 {
					by[g] = append(by[g], walkWeight{weight, wk.walk(s, p, a)})
				}
			}
		}
		add(0, PathClusterIP, 1, s.Endpoints > 0)
		add(1, PathNodePort, b2i(x.NodePort), x.Endpoints > 0)
		add(2, PathExternalIP, x.ExternalIPs, x.Endpoints > 0)
		add(2, PathLoadBalancer, x.LoadBalancerIPs, x.Endpoints > 0)
		wk.next(s)
	}
	fp := FirstPacket{Note: note}
	all := slices.Concat(by[0], by[1], by[2])
	fp.RulesP50, fp.RulesP99 = quantiles(all)
	fp.ClusterIP, fp.NodePort, fp.LoadBalancer = pathWalk(by[0]), pathWalk(by[1]), pathWalk(by[2])
	return fp
}

func pathWeights(w *Weights, p Path) []float64 {
	if w == nil {
		return nil
	}
	return [...][]float64{w.ClusterIP, w.NodePort, w.ExternalIP, w.LoadBalancer}[p]
}

type walkWeight struct{ w, rules float64 }

func pathWalk(xs []walkWeight) *PathWalk {
	if len(xs) == 0 {
		return nil
	}
	p50, p99 := quantiles(xs)
	return &PathWalk{RulesP50: p50, RulesP99: p99}
}

// quantiles are the weighted p50 and p99 of xs (sorted in place).
func quantiles(xs []walkWeight) (p50, p99 float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	slices.SortFunc(xs, func(a, b walkWeight) int { return cmp.Compare(a.rules, b.rules) })
	total := 0.0
	for _, x := range xs {
		total += x.w
	}
	q := func(p float64) float64 {
		acc := 0.0
		for _, x := range xs {
			acc += x.w
			if acc >= p*total {
				return x.rules
			}
		}
		return xs[len(xs)-1].rules
	}
	return q(0.5), q(0.99)
}

const iptablesWalkNote = "iptables: linear in the Service count. Cluster IP: its rule's position in nat KUBE-SERVICES (cluster, external and load-balancer IP rules in service-port name order), the masquerade check, the statistic cascade to the chosen endpoint ((n+1)/2 on average; affinity adds n recent checks) and the KUBE-SEP's two. Node port: all of KUBE-SERVICES (the jump to KUBE-NODEPORTS is its last rule), its position in KUBE-NODEPORTS (two rules per node port: 127.0.0.0/8 and the port), KUBE-EXT (masquerade; under Local three short-circuit checks) and the policy chain. Load-balancer and external IP: their rule's position in KUBE-SERVICES, KUBE-FW's source ranges up to the middle one, then as a node port after KUBE-NODEPORTS"

const nftablesWalkNote = "nftables: constant in the Service count (verdict maps). Cluster IP: the firewall-check vmap, services' masquerade check and service-ips vmap, the service chain's DNAT (affinity: a lookup per endpoint, the numgen vmap, the endpoint chain's update and DNAT). Node port: the same, service-ips missed, then the service-nodeports vmap and the external chain (masquerade and goto; under Local three short-circuit checks). Load-balancer and external IP: service-ips to the external chain (a firewall chain's rule first for source ranges)"

const ipvsWalkNote = "ipvs: constant in the Service count (ipsets and the IPVS hash; the rules for an empty set are not written). Cluster IP: nat KUBE-SERVICES' set matches up to the KUBE-CLUSTER-IP ACCEPT, KUBE-NODE-PORT walked on the way (cluster IPs are local addresses on kube-ipvs0), then the virtual-server lookup. Node port: all of KUBE-SERVICES and KUBE-NODE-PORT up to its set (Local: up to the -LOCAL RETURN). Load-balancer IP: KUBE-LOAD-BALANCER, then the rest of KUBE-SERVICES and KUBE-NODE-PORT. External IP: its set's masquerade and ACCEPT"

// iptWalker walks kube-proxy's iptables layout.
type iptWalker struct {
	masq bool
	// services and nodePorts are nat KUBE-SERVICES' and KUBE-NODEPORTS'
	// rules; svcBefore and npBefore those before the current port's.
	services, nodePorts, svcBefore, npBefore float64
}

func newIPTablesWalker(in []ServicePortInput, masq bool) *iptWalker {
	t := &iptWalker{masq: masq, services: 1} // the jump to KUBE-NODEPORTS
	for i := range in {
		sv, np := iptablesTopRules(&in[i])
		t.services += sv
		t.nodePorts += np
	}
	return t
}

// iptablesTopRules are a port's nat KUBE-SERVICES and KUBE-NODEPORTS rules.
func iptablesTopRules(s *ServicePortInput) (services, nodePorts float64) {
	x := &s.External
	services = float64(b2i(s.hasInternal()))
	if !s.Reject {
		services += float64(x.ExternalIPs + x.LoadBalancerIPs)
		nodePorts = float64(2 * b2i(x.NodePort))
	}
	return services, nodePorts
}

func (t *iptWalker) next(s *ServicePortInput) {
	sv, np := iptablesTopRules(s)
	t.svcBefore += sv
	t.npBefore += np
}

func (t *iptWalker) walk(s *ServicePortInput, p Path, addr int) float64 {
	x := &s.External
	switch {
	case p == PathClusterIP && s.hasInternal():
		return t.svcBefore + 1 + t.policy(float64(s.Endpoints), s.Affinity, t.masq)
	case p == PathNodePort && s.Reject:
		return t.services + t.nodePorts // no rule of its own in either
	case p == PathClusterIP || s.Reject:
		return t.services // no rule of its own: to the end of KUBE-SERVICES
	case p == PathNodePort:
		return t.services + t.npBefore + 2 + t.ext(s)
	}
	pos := t.svcBefore + float64(b2i(s.hasInternal())+addr+1)
	if p == PathLoadBalancer {
		pos += float64(x.ExternalIPs)
		if x.SourceRanges > 0 {
			pos += float64(x.SourceRanges+1) / 2
		}
	}
	return pos + t.ext(s)
}

// policy is a policy chain: its masquerade check (the cluster-IP chain's
// first rule), the affinity checks, the cascade to the chosen endpoint and
// the endpoint chain's two rules.
func (t *iptWalker) policy(n float64, affinity, masq bool) float64 {
	r := float64(b2i(masq)) + (n+1)/2 + 2
	if affinity {
		r += n
	}
	return r
}

// ext is the KUBE-EXT chain from outside the cluster: Cluster, the
// masquerade jump (and KUBE-MARK-MASQ's rule) and the jump on; Local, the
// three short-circuits that do not match, then the jump on when there are
// local endpoints (else the walk ends: dropped).
func (t *iptWalker) ext(s *ServicePortInput) float64 {
	x := &s.External
	masq := x.SameChain && s.hasInternal() && t.masq
	if !x.Local {
		return 3 + t.policy(float64(x.Endpoints), s.Affinity, masq)
	}
	r := float64(b2i(t.masq) + 2)
	if x.Endpoints == 0 {
		return r
	}
	return r + 1 + t.policy(float64(x.Endpoints), s.Affinity, masq)
}

// nftWalker walks kube-proxy's nftables layout.
type nftWalker struct{ masq bool }

func (nftWalker) next(*ServicePortInput) {}

func (t nftWalker) walk(s *ServicePortInput, p Path, _ int) float64 {
	x := &s.External
	// firewall-check's vmap, services' masquerade check and service-ips.
	r := 1 + float64(b2i(t.masq)) + 1
	switch {
	case p == PathClusterIP && s.hasInternal():
		return r + nftPolicy(float64(s.Endpoints), s.Affinity)
	case p == PathClusterIP || s.Reject:
		return r + 1 // the service-nodeports rule, then filter's verdict
	case p == PathNodePort:
		r++ // service-nodeports
	case p == PathLoadBalancer && x.SourceRanges > 0:
		r++ // the firewall chain's drop rule, not matched
	}
	if !x.Local {
		return r + 2 + nftPolicy(float64(x.Endpoints), s.Affinity)
	}
	r += float64(b2i(t.masq) + 2)
	if x.Endpoints == 0 {
		return r
	}
	return r + 1 + nftPolicy(float64(x.Endpoints), s.Affinity)
}

// nftPolicy is a policy chain: its DNAT, or under affinity a lookup per
// endpoint, the numgen vmap and the endpoint chain's update and DNAT.
func nftPolicy(n float64, affinity bool) float64 {
	if affinity {
		return n + 3
	}
	return 1
}

// ipvsWalker walks IPVS mode's iptables rules and its virtual-server hash.
type ipvsWalker struct{ l *ipvsLayout }

func (ipvsWalker) next(*ServicePortInput) {}

func (t ipvsWalker) walk(s *ServicePortInput, p Path, _ int) float64 {
	l := t.l
	x := &s.External
	all := float64(l.servicesRules())
	np := float64(l.nodePortRules(-1))
	switch p {
	case PathNodePort:
		if x.Local {
			return all + float64(l.nodePortRules(protoIndex(s.Name.Protocol))) + 1 + 1
		}
		return all + np + 1 + 1 // KUBE-MARK-MASQ's rule, the lookup
	case PathLoadBalancer:
		lb := 1.0 // KUBE-LOAD-BALANCER-LOCAL's RETURN
		if !x.Local {
			lb = float64(b2i(l.lbLocal)) + 2 // the masquerade jump and its rule
		}
		return all + lb + np + 1
	case PathExternalIP:
		r := float64(1 + b2i(l.lb) + b2i(l.ports))
		if x.Local {
			return r + float64(3*b2i(l.ext)) + 1 + 1
		}
		return r + 3 + 1 // masquerade (and its rule), ACCEPT, the lookup
	}
	// The cluster IP: every rule but KUBE-LOAD-BALANCER's ACCEPT, which
	// comes after KUBE-CLUSTER-IP's.
	return all - float64(b2i(l.lb)) + np + 1
}

// String is a one-line summary, for logs.
func (f FirstPacket) String() string {
	s := fmt.Sprintf("%.0f/%.0f", f.RulesP50, f.RulesP99)
	for _, p := range []struct {
		name string
		w    *PathWalk
	}{{"node port", f.NodePort}, {"load balancer", f.LoadBalancer}} {
		if p.w != nil {
			s += fmt.Sprintf(", %s %.0f/%.0f", p.name, p.w.RulesP50, p.w.RulesP99)
		}
	}
	return s
}
