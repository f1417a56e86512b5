package ipvs

// The renderer turns the cluster state into a Plan: what kube-proxy's
// syncProxyRules would program on this node. It never touches the kernel.
// Each piece (the virtual servers of a service port, the ipset entries, the
// iptables rules) is a small function, as style.md asks.

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

// VirtualServer is one IPVS service as planned.
type VirtualServer struct {
	Key
	// ServicePort is the service port it serves.
	ServicePort cluster.ServicePortName
	Scheduler   string
	Flags       uint32
	// Timeout is the persistence timeout in seconds (FlagPersistent).
	Timeout uint32
	// Bind says the address goes on kube-ipvs0 (cluster IPs do; node
	// addresses are already local).
	Bind bool
	// Dests are the real servers, sorted by address and port.
	Dests []Dest
}

// Dest is one real server as planned.
type Dest struct {
	Addr   netip.AddrPort
	Weight int
}

// Plan is everything a sync programs.
type Plan struct {
	// Servers are the virtual servers, sorted by key.
	Servers []*VirtualServer
	// Bind are the addresses kube-ipvs0 must hold, sorted.
	Bind []netip.Addr
	// Sets maps every ipset kube-proxy creates to its entries, sorted.
	Sets map[string][]string
	// Restore is the iptables-restore --noflush input (filter and nat).
	Restore string
	// RestoreLines counts its lines.
	RestoreLines int
	// NoLocalEndpoints counts the Services (by name, as kube-proxy does)
	// with a Local policy and no local endpoint, by "internal" or
	// "external".
	NoLocalEndpoints map[string]int
	// lbNoNodeAccess are the load-balancer ip,proto:port destinations with
	// source ranges none of which holds the node's address: the node may
	// not reach them (KUBE-IPVS-OUT-FILTER drops it), in render order.
	lbNoNodeAccess []lbEntry
}

// lbEntry is a load-balancer destination of KUBE-IPVS-OUT-FILTER.
type lbEntry struct {
	ip    netip.Addr
	proto string
	port  int32
}

// Server returns the planned virtual server with key k.
func (p *Plan) Server(k Key) (*VirtualServer, bool) {
	i, ok := slices.BinarySearchFunc(p.Servers, k, func(v *VirtualServer, k Key) int { return v.Key.Compare(k) })
	if !ok {
		return nil, false
	}
	return p.Servers[i], true
}

// Renderer computes Plans for one node. It keeps the memory of the
// keep-deleted-endpoint fault between renders; otherwise it is stateless.
// It is not safe for concurrent use.
type Renderer struct {
	cfg    Config
	cat    proxy.Categorizer
	memory *proxy.EndpointMemory
}

// NewRenderer validates cfg and returns a renderer.
func NewRenderer(cfg Config) (*Renderer, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	r := &Renderer{cfg: cfg, cat: cfg.Faults.Categorizer(cfg.NodeName, cfg.PreferSameNode)}
	if cfg.Faults.Has(proxy.FaultKeepDeletedEndpoint) {
		r.memory = proxy.NewEndpointMemory()
	}
	return r, nil
}

// Config returns the renderer's configuration, defaults filled in.
func (r *Renderer) Config() Config { return r.cfg }

// Render plans the whole node from st.
func (r *Renderer) Render(st *cluster.State) *Plan {
	p := &Plan{Sets: map[string][]string{}, NoLocalEndpoints: map[string]int{"internal": 0, "external": 0}}
	for _, s := range ipsets {
		p.Sets[s.name] = nil
	}
	if n := st.Nodes[r.cfg.NodeName]; n != nil {
		r.cat.Zone = n.Zone
	}
	noLocal := map[string]map[string]bool{"internal": {}, "external": {}}
	bind := map[netip.Addr]bool{}
	for _, spn := range st.SortedServicePorts() {
		sp := st.Services[spn]
		if sp.Headless || !sp.ClusterIP.IsValid() || !sp.ClusterIP.Is4() {
			continue
		}
		eps := st.Endpoints[spn]
		if r.memory != nil {
			eps = r.memory.Merge(spn, eps)
		}
		cat := r.cat.Categorize(eps, sp)
		r.servicePort(p, spn, sp, eps, cat, noLocal)
	}
	for _, v := range p.Servers {
		if v.Bind {
			bind[v.Addr] = true
		}
	}
	for a := range bind {
		p.Bind = append(p.Bind, a)
	}
	slices.SortFunc(p.Bind, netip.Addr.Compare)
	for _, a := range p.Bind {
		p.Sets[SetIPVSIPs] = append(p.Sets[SetIPVSIPs], a.String())
	}
	for name, entries := range p.Sets {
		slices.Sort(entries)
		p.Sets[name] = slices.Compact(entries)
	}
	slices.SortFunc(p.Servers, func(a, b *VirtualServer) int { return a.Key.Compare(b.Key) })
	p.Restore, p.RestoreLines = r.iptablesRules(p.Sets, p.lbNoNodeAccess)
	for k, set := range noLocal {
		p.NoLocalEndpoints[k] = len(set)
	}
	return p
}

// servicePort plans one service port: the ClusterIP virtual server with the
// internal endpoints, one virtual server per node address with the external
// ones, and its ipset entries.
func (r *Renderer) servicePort(p *Plan, spn cluster.ServicePortName, sp *cluster.ServicePort, eps []*cluster.Endpoint, cat proxy.Categorized, noLocal map[string]map[string]bool) {
	proto := strings.ToLower(string(spn.Protocol))
	// Hairpin: every local endpoint (whatever its readiness, as kube-proxy
	// walks the whole endpoints map) masquerades traffic to itself.
	for _, ep := range eps {
		if ep.NodeName == r.cfg.NodeName && ep.IP.Is4() && !r.cfg.Faults.Has(proxy.FaultHairpinNoMasquerade) {
			p.Sets[SetLoopBack] = append(p.Sets[SetLoopBack], fmt.Sprintf("%s,%s:%d,%s", ep.IP, proto, ep.Port, ep.IP))
		}
	}
	p.Sets[SetClusterIP] = append(p.Sets[SetClusterIP], fmt.Sprintf("%s,%s:%d", sp.ClusterIP, proto, sp.Port))
	vs := r.virtualServer(spn, sp, sp.ClusterIP, uint16(sp.Port))
	vs.Bind = true
	vs.Dests = r.dests(r.endpointsFor(spn, sp, cat, proxy.InternalPolicyLocal(sp), noLocal))
	p.Servers = append(p.Servers, vs)

	external := func() []Dest {
		local := proxy.ExternalPolicyLocal(sp) && !r.cfg.Faults.Has(proxy.FaultLocalIgnored)
		return r.dests(r.endpointsFor(spn, sp, cat, local, noLocal))
	}
	// The Local sets exempt their destinations from masquerade; under the
	// local-masquerade fault nothing is exempt.
	localSets := proxy.ExternalPolicyLocal(sp) && !r.cfg.Faults.Has(proxy.FaultLocalMasquerade)
	for _, a := range sp.ExternalIPs {
		e := fmt.Sprintf("%s,%s:%d", a, proto, sp.Port)
		if localSets {
			p.Sets[SetExternalIPLocal] = append(p.Sets[SetExternalIPLocal], e)
		} else {
			p.Sets[SetExternalIP] = append(p.Sets[SetExternalIP], e)
		}
		v := r.virtualServer(spn, sp, a, uint16(sp.Port))
		v.Bind = !slices.Contains(r.cfg.NodeIPs, a)
		v.Dests = external()
		p.Servers = append(p.Servers, v)
	}
	for _, a := range sp.LoadBalancerIPs {
		r.loadBalancer(p, spn, sp, a, proto, localSets)
		v := r.virtualServer(spn, sp, a, uint16(sp.Port))
		v.Bind = !slices.Contains(r.cfg.NodeIPs, a)
		v.Dests = external()
		p.Servers = append(p.Servers, v)
	}
	if sp.NodePort != 0 && len(r.cfg.NodeIPs) > 0 {
		r.nodePort(p, spn, sp, proto, localSets, external())
	}
	// kube-proxy skips the health check port when it cannot program the
	// node port (no node address).
	if sp.HealthCheckNodePort != 0 && (sp.NodePort == 0 || len(r.cfg.NodeIPs) > 0) {
		p.Sets[SetHealthCheckNodePort] = append(p.Sets[SetHealthCheckNodePort], strconv.Itoa(int(sp.HealthCheckNodePort)))
	}
}

// loadBalancer adds a load-balancer IP's ipset entries: KUBE-LOAD-BALANCER
// (masquerade unless -LOCAL has it too), and with source ranges
// KUBE-LOAD-BALANCER-FW, one KUBE-LOAD-BALANCER-SOURCE-CIDR entry per range
// and, when a range holds the node's address, KUBE-LOAD-BALANCER-SOURCE-IP
// for the address itself (else the node is kept off it, lbNoNodeAccess).
func (r *Renderer) loadBalancer(p *Plan, spn cluster.ServicePortName, sp *cluster.ServicePort, a netip.Addr, proto string, localSets bool) {
	e := fmt.Sprintf("%s,%s:%d", a, proto, sp.Port)
	p.Sets[SetLoadBalancer] = append(p.Sets[SetLoadBalancer], e)
	if localSets {
		p.Sets[SetLoadBalancerLocal] = append(p.Sets[SetLoadBalancerLocal], e)
	}
	if len(sp.SourceRanges) == 0 {
		return
	}
	p.Sets[SetLoadBalancerFW] = append(p.Sets[SetLoadBalancerFW], e)
	var nodeIP netip.Addr
	if len(r.cfg.NodeIPs) > 0 {
		nodeIP = r.cfg.NodeIPs[0]
	}
	allowFromNode := false
	for _, c := range sp.SourceRanges {
		p.Sets[SetLoadBalancerSourceCI] = append(p.Sets[SetLoadBalancerSourceCI], fmt.Sprintf("%s,%s:%d,%s", a, proto, sp.Port, c))
		allowFromNode = allowFromNode || c.Contains(nodeIP)
	}
	if allowFromNode {
		p.Sets[SetLoadBalancerSourceIP] = append(p.Sets[SetLoadBalancerSourceIP], fmt.Sprintf("%s,%s:%d,%s", a, proto, sp.Port, a))
	} else {
		p.lbNoNodeAccess = append(p.lbNoNodeAccess, lbEntry{ip: a, proto: proto, port: sp.Port})
	}
}

// nodePort adds a node port's ipset entries and one virtual server per node
// address, with the external endpoints.
func (r *Renderer) nodePort(p *Plan, spn cluster.ServicePortName, sp *cluster.ServicePort, proto string, localSets bool, ext []Dest) {
	switch proto {
	case "tcp", "udp":
		set := SetNodePortTCP
		local := SetNodePortLocalTCP
		if proto == "udp" {
			set, local = SetNodePortUDP, SetNodePortLocalUDP
		}
		p.Sets[set] = append(p.Sets[set], strconv.Itoa(int(sp.NodePort)))
		if localSets {
			p.Sets[local] = append(p.Sets[local], strconv.Itoa(int(sp.NodePort)))
		}
	case "sctp":
		for _, a := range r.cfg.NodeIPs {
			e := fmt.Sprintf("%s,sctp:%d", a, sp.NodePort)
			p.Sets[SetNodePortSCTP] = append(p.Sets[SetNodePortSCTP], e)
			if localSets {
				p.Sets[SetNodePortLocalSCTP] = append(p.Sets[SetNodePortLocalSCTP], e)
			}
		}
	}
	for _, a := range r.cfg.NodeIPs {
		nv := r.virtualServer(spn, sp, a, uint16(sp.NodePort))
		nv.Dests = ext
		p.Servers = append(p.Servers, nv)
	}
}

// virtualServer is the service as syncProxyRules builds it: the scheduler,
// persistence for ClientIP affinity, FlagSourceHash for mh.
func (r *Renderer) virtualServer(spn cluster.ServicePortName, sp *cluster.ServicePort, a netip.Addr, port uint16) *VirtualServer {
	v := &VirtualServer{Key: Key{Proto: string(spn.Protocol), Addr: a, Port: port}, ServicePort: spn, Scheduler: r.cfg.schedulerFor()}
	if sp.ClientIPAffinity {
		v.Flags |= FlagPersistent
		v.Timeout = uint32(sp.AffinityTimeout)
		if r.cfg.Faults.Has(proxy.FaultAffinityNoTimeout) {
			v.Timeout = noTimeout
		}
	}
	if r.cfg.Scheduler == "mh" {
		v.Flags |= FlagSourceHash
	}
	return v
}

// endpointsFor is syncEndpoint's choice: with onlyLocal, the local
// endpoints, falling back to the cluster's when there are none (kube-proxy
// PR #97081: pods on a node without a local endpoint still reach the
// Service). The cluster set is empty when the service port never uses
// Cluster policy (internalTrafficPolicy Local and not reachable from
// outside), so the fallback is empty then and the virtual server has no
// real server: the kernel rejects. The no-local-endpoints counters are
// kube-proxy's: per Service, for either policy that is Local.
func (r *Renderer) endpointsFor(spn cluster.ServicePortName, sp *cluster.ServicePort, cat proxy.Categorized, onlyLocal bool, noLocal map[string]map[string]bool) []*cluster.Endpoint {
	if !onlyLocal {
		return cat.Cluster
	}
	if len(cat.Local) > 0 {
		return cat.Local
	}
	name, roles := spn.NamespacedName.String(), cat.Roles(sp)
	if roles.NoLocalInternal {
		noLocal["internal"][name] = true
	}
	if roles.NoLocalExternal {
		noLocal["external"][name] = true
	}
	return cat.Cluster
}

// dests turns endpoints into real servers of weight 1, sorted, with the
// faults that act here: drop-last-endpoint leaves the last one out;
// uniform-probability gives the last one weight 2; skew-at-mde (unless
// uniform-probability is on too) weights the first 11(k-1) and the others
// 10k-11, so that wrr gives the first exactly 1.1/k of the connections of a
// rotation (a single real server keeps weight 1).
func (r *Renderer) dests(eps []*cluster.Endpoint) []Dest {
	seen := map[netip.AddrPort]bool{}
	out := make([]Dest, 0, len(eps))
	for _, ep := range eps {
		a := netip.AddrPortFrom(ep.IP, uint16(ep.Port))
		if !ep.IP.Is4() || seen[a] {
			continue
		}
		seen[a] = true
		out = append(out, Dest{Addr: a, Weight: 1})
	}
	slices.SortFunc(out, func(a, b Dest) int { return a.Addr.Compare(b.Addr) })
	if r.cfg.Faults.Has(proxy.FaultDropLastEndpoint) && len(out) > 0 {
		out = out[:len(out)-1]
	}
	switch {
	case r.cfg.Faults.Has(proxy.FaultUniformProbability) && len(out) > 1:
		out[len(out)-1].Weight = 2
	case r.cfg.Faults.Has(proxy.FaultSkewAtMDE) && len(out) > 1:
		for i, w := range proxy.MDESkewWeights(len(out)) {
			out[i].Weight = int(w)
		}
	}
	return out
}
