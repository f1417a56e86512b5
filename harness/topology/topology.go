// Package topology turns a loaded scenario (the cluster model and the
// scenario's traffic clients) into the namespace topology dataplane/netns
// builds: one node namespace per node, every endpoint address in its node's
// backend namespace, and the client pods with their addresses. netns knows
// nothing of scenarios or of the cluster model; this is where the two meet.
package topology

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Options shape FromState.
type Options struct {
	// RunID names the run; empty draws a random one.
	RunID string
	// NodeNetwork is the prefix of node addresses (the scenario's
	// cluster.nodeNetwork). Zero, or not holding a node's IP: that node's
	// address gets a /16.
	NodeNetwork netip.Prefix
	// Clients are the scenario's traffic clients (traffic.clients).
	Clients []scenario.Client
	// ServiceCIDR is routed out of each node's uplink, as a node's default
	// route would carry it, so that a ClusterIP packet the proxy does not
	// DNAT reaches the FORWARD chain (where kube-proxy drops or rejects it)
	// instead of failing the routing lookup. Nothing answers there.
	ServiceCIDR netip.Prefix
	// ExternalNetwork holds the addresses of clients outside the cluster
	// (cluster.externalNetwork); zero: scenario.DefaultExternalNetwork.
	ExternalNetwork netip.Prefix
	// Checks are the scenario's checks: a check from outside the cluster
	// asks for an outside client (one is added when no traffic client
	// stands there), a source-ranges check for addresses inside and
	// outside its Service's ranges, and a hairpin check for endpoint pods.
	Checks []scenario.Check
}

// FromModel derives the topology of a loaded scenario: its nodes, every
// endpoint of its state and its traffic clients.
func FromModel(m *apiserver.Model, runID string) (*netns.Config, error) {
	o := Options{RunID: runID}
	if m.Expanded != nil && m.Expanded.Scenario != nil {
		sc := m.Expanded.Scenario
		if p, err := netip.ParsePrefix(sc.Cluster.NodeNetwork); err == nil {
			o.NodeNetwork = p
		}
		if p, err := netip.ParsePrefix(sc.Cluster.ServiceCIDR); err == nil {
			o.ServiceCIDR = p
		}
		if p, err := netip.ParsePrefix(sc.Cluster.ExternalNetwork); err == nil {
			o.ExternalNetwork = p
		}
		if sc.Traffic != nil {
			o.Clients = sc.Traffic.Clients
		}
		o.Checks = sc.Checks
	}
	return FromState(m.State, o)
}

// FromState derives a topology from the cluster state: one node namespace
// per node, every endpoint address (ready or not: a pod that exists has its
// address) in its node's backend namespace, and client pods with addresses
// taken from the top of their node's pod block downwards, skipping endpoint
// addresses (the scenario allocates pod addresses from the bottom up, so
// scale events rarely meet a client address).
//
// An endpoint is placed on its NodeName; without one, on the node whose pod
// CIDR holds it; failing that, on the first node (it is still reachable: the
// other nodes get a /32 route to it).
func FromState(st *cluster.State, o Options) (*netns.Config, error) {
	if st == nil || len(st.Nodes) == 0 {
		return nil, errors.New("could not derive a topology: the cluster has no node")
	}
	id := o.RunID
	if id == "" {
		var err error
		if id, err = netns.NewRunID(); err != nil {
			return nil, err
		}
	}
	if !netns.ValidRunID(id) {
		return nil, fmt.Errorf("could not derive a topology: run id %q is not %d lower-case hex characters", id, netns.RunIDLen)
	}
	cfg := &netns.Config{RunID: id, ServiceCIDR: o.ServiceCIDR}
	index := map[string]int{}
	for i, name := range st.SortedNodes() {
		n := st.Nodes[name]
		if !n.IP.Is4() {
			return nil, fmt.Errorf("could not derive a topology: node %s has no IPv4 address", name)
		}
		if !n.PodCIDR.IsValid() || !n.PodCIDR.Addr().Is4() || n.PodCIDR.Bits() > 30 {
			return nil, fmt.Errorf("could not derive a topology: node %s has pod CIDR %v, need an IPv4 block of /30 or wider", name, n.PodCIDR)
		}
		bits := 16
		if o.NodeNetwork.IsValid() && o.NodeNetwork.Contains(n.IP) {
			bits = o.NodeNetwork.Bits()
		}
		pc := n.PodCIDR.Masked()
		cfg.Nodes = append(cfg.Nodes, netns.NodeConfig{
			Name:    name,
			Addr:    netip.PrefixFrom(n.IP, bits),
			PodCIDR: pc,
			Gateway: pc.Addr().Next(),
		})
		index[name] = i
	}
	if err := placeEndpoints(cfg.Nodes, st, index); err != nil {
		return nil, err
	}
	if err := placeEndpointPods(cfg.Nodes, st, o.Checks); err != nil {
		return nil, err
	}
	if err := placeClients(cfg, o.Clients, index); err != nil {
		return nil, err
	}
	if err := placeOutside(cfg, st, o); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Endpoints places the endpoint addresses of st on the nodes of cfg as
// FromState does, for Topology.SyncEndpoints when Services scale during a
// run: node name to its sorted addresses.
func Endpoints(cfg *netns.Config, st *cluster.State) (map[string][]netip.Addr, error) {
	nodes := slices.Clone(cfg.Nodes)
	index := map[string]int{}
	for i := range nodes {
		nodes[i].Endpoints = nil
		index[nodes[i].Name] = i
	}
	if err := placeEndpoints(nodes, st, index); err != nil {
		return nil, err
	}
	// An endpoint pod (hairpin) keeps its own namespace.
	for i := range nodes {
		nodes[i].Endpoints = slices.DeleteFunc(nodes[i].Endpoints, func(a netip.Addr) bool {
			return slices.ContainsFunc(nodes[i].Clients, func(c netns.ClientConfig) bool { return c.Endpoint && c.Addrs[0] == a })
		})
	}
	out := map[string][]netip.Addr{}
	for _, n := range nodes {
		out[n.Name] = n.Endpoints
	}
	return out, nil
}

// HostEndpoint names the node whose own address ip is: a host-network
// endpoint (kube-dns aside, the kubernetes Service's API server endpoints
// and any hostNetwork pod have one), or "" when ip is no node's.
func HostEndpoint(st *cluster.State, ip netip.Addr) string {
	for _, name := range st.SortedNodes() {
		if st.Nodes[name].IP == ip {
			return name
		}
	}
	return ""
}

// placeEndpoints puts each endpoint address in its node's backend
// namespace. A host-network endpoint (the address of a node) is not placed:
// the node namespace already holds that address, so a connection DNATed to
// it reaches the node itself, as in a cluster; no pod namespace sees it,
// and sim conform does not run checks on such a port (HostEndpoint).
func placeEndpoints(nodes []netns.NodeConfig, st *cluster.State, index map[string]int) error {
	where := map[netip.Addr]int{}
	nodeAddr := map[netip.Addr]bool{}
	for _, n := range nodes {
		nodeAddr[n.Addr.Addr()] = true
	}
	for _, spn := range st.SortedServicePorts() {
		for _, ep := range st.Endpoints[spn] {
			if !ep.IP.Is4() {
				return fmt.Errorf("could not derive a topology: endpoint %s of %s is not IPv4", ep.IP, spn)
			}
			if nodeAddr[ep.IP] {
				continue
			}
			ni, ok := index[ep.NodeName]
			if !ok {
				ni = 0
				for i, n := range nodes {
					if n.PodCIDR.Contains(ep.IP) {
						ni = i
						break
					}
				}
			}
			if prev, seen := where[ep.IP]; seen {
				if prev != ni {
					return fmt.Errorf("could not derive a topology: endpoint %s is on node %s and on node %s", ep.IP, nodes[prev].Name, nodes[ni].Name)
				}
				continue
			}
			where[ep.IP] = ni
			nodes[ni].Endpoints = append(nodes[ni].Endpoints, ep.IP)
		}
	}
	for i := range nodes {
		slices.SortFunc(nodes[i].Endpoints, netip.Addr.Compare)
	}
	return nil
}

func placeClients(cfg *netns.Config, clients []scenario.Client, index map[string]int) error {
	used := map[netip.Addr]bool{}
	for _, n := range cfg.Nodes {
		used[n.Addr.Addr()] = true
		for _, a := range n.Endpoints {
			used[a] = true
		}
		for _, c := range n.Clients {
			for _, a := range c.Addrs {
				used[a] = true
			}
		}
	}
	next := make([]netip.Addr, len(cfg.Nodes))
	for i, n := range cfg.Nodes {
		next[i] = LastHost(n.PodCIDR)
	}
	for ci, c := range clients {
		if c.Where != "" && c.Where != cluster.InPod {
			continue // host clients are the node namespaces; outside ones placeOutside's
		}
		nodes := c.Nodes
		if len(nodes) == 0 {
			for _, n := range cfg.Nodes {
				nodes = append(nodes, n.Name)
			}
		}
		pods := max(c.PodsPerNode, 1)
		srcs := max(c.SourceIPs, 1)
		for _, name := range nodes {
			ni, ok := index[name]
			if !ok {
				return fmt.Errorf("could not derive a topology: traffic.clients[%d] (%s) names node %q, which the cluster does not have", ci, c.Name, name)
			}
			n := &cfg.Nodes[ni]
			for p := range pods {
				cc := netns.ClientConfig{Group: c.Name, Index: p}
				for range srcs {
					a := next[ni]
					for used[a] && n.PodCIDR.Contains(a) && a != n.Gateway {
						a = a.Prev()
					}
					if !n.PodCIDR.Contains(a) || a == n.Gateway || a == n.PodCIDR.Addr() {
						return fmt.Errorf("could not derive a topology: node %s's pod CIDR %s has no address left for the pods of client %s (%d pods x %d source IPs); lower them or widen the blocks with cluster.nodeCIDRMaskSize",
							n.Name, n.PodCIDR, c.Name, pods, srcs)
					}
					used[a] = true
					next[ni] = a.Prev()
					cc.Addrs = append(cc.Addrs, a)
				}
				n.Clients = append(n.Clients, cc)
			}
		}
	}
	return nil
}

// LastHost is the highest address of p below its broadcast address: the
// first client address a node hands out, counting down.
func LastHost(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= (1 << (32 - p.Bits())) - 1
	v--
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
