package netns

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Config is everything a Topology creates, derived from a cluster.State by
// ConfigFromState. It is plain data, so tests can build one by hand.
type Config struct {
	// RunID names the run: every name starts with RunPrefix(RunID).
	RunID string
	// Nodes in name order. Node i (0-based) has the fabric port "kp<runid>f<i+1>".
	Nodes []NodeConfig
	// ServiceCIDR is routed out of every node's uplink (Options.ServiceCIDR).
	ServiceCIDR netip.Prefix
}

// NodeConfig is one node: its namespace, its backend namespace and its client
// pod namespaces.
type NodeConfig struct {
	Name string
	// Addr is the node's address on the fabric with its prefix length
	// (the scenario's node network, or /16), e.g. 198.18.0.1/16.
	Addr netip.Prefix
	// PodCIDR is the node's pod block; Gateway (its .1) sits on the node side
	// of the backend link and is every pod's default gateway.
	PodCIDR netip.Prefix
	Gateway netip.Addr
	// Endpoints are the addresses of every endpoint placed on this node,
	// sorted, each a /32 in the node's backend namespace.
	Endpoints []netip.Addr
	// Clients are the client pods on this node.
	Clients []ClientConfig
}

// ClientConfig is one client pod.
type ClientConfig struct {
	// Group is the scenario's client name; Index counts the group's pods on
	// this node from 0.
	Group string
	Index int
	// Addrs are the pod's source addresses, the pod IP first; more than one
	// when the group asks for several sourceIPs.
	Addrs []netip.Addr
}

// Options shape ConfigFromState.
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
}

// ConfigFromModel derives the topology of a loaded scenario: its nodes,
// every endpoint of its state and its traffic clients.
func ConfigFromModel(m *apiserver.Model, runID string) (*Config, error) {
	o := Options{RunID: runID}
	if m.Expanded != nil && m.Expanded.Scenario != nil {
		sc := m.Expanded.Scenario
		if p, err := netip.ParsePrefix(sc.Cluster.NodeNetwork); err == nil {
			o.NodeNetwork = p
		}
		if p, err := netip.ParsePrefix(sc.Cluster.ServiceCIDR); err == nil {
			o.ServiceCIDR = p
		}
		if sc.Traffic != nil {
			o.Clients = sc.Traffic.Clients
		}
	}
	return ConfigFromState(m.State, o)
}

// ConfigFromState derives a topology from the cluster state: one node
// namespace per node, every endpoint address (ready or not: a pod that exists
// has its address) in its node's backend namespace, and client pods with
// addresses taken from the top of their node's pod block downwards, skipping
// endpoint addresses (the scenario allocates pod addresses from the bottom
// up, so scale events rarely meet a client address).
//
// An endpoint is placed on its NodeName; without one, on the node whose pod
// CIDR holds it; failing that, on the first node (it is still reachable: the
// other nodes get a /32 route to it).
func ConfigFromState(st *cluster.State, o Options) (*Config, error) {
	if st == nil || len(st.Nodes) == 0 {
		return nil, errors.New("could not derive a topology: the cluster has no node")
	}
	id := o.RunID
	if id == "" {
		var err error
		if id, err = NewRunID(); err != nil {
			return nil, err
		}
	}
	if !ValidRunID(id) {
		return nil, fmt.Errorf("could not derive a topology: run id %q is not %d lower-case hex characters", id, RunIDLen)
	}
	cfg := &Config{RunID: id, ServiceCIDR: o.ServiceCIDR}
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
		cfg.Nodes = append(cfg.Nodes, NodeConfig{
			Name:    name,
			Addr:    netip.PrefixFrom(n.IP, bits),
			PodCIDR: pc,
			Gateway: pc.Addr().Next(),
		})
		index[name] = i
	}
	if err := placeEndpoints(cfg, st, index); err != nil {
		return nil, err
	}
	if err := placeClients(cfg, o.Clients, index); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

func placeEndpoints(cfg *Config, st *cluster.State, index map[string]int) error {
	where := map[netip.Addr]int{}
	for _, spn := range st.SortedServicePorts() {
		for _, ep := range st.Endpoints[spn] {
			if !ep.IP.Is4() {
				return fmt.Errorf("could not derive a topology: endpoint %s of %s is not IPv4", ep.IP, spn)
			}
			ni, ok := index[ep.NodeName]
			if !ok {
				ni = 0
				for i, n := range cfg.Nodes {
					if n.PodCIDR.Contains(ep.IP) {
						ni = i
						break
					}
				}
			}
			if prev, seen := where[ep.IP]; seen {
				if prev != ni {
					return fmt.Errorf("could not derive a topology: endpoint %s is on node %s and on node %s", ep.IP, cfg.Nodes[prev].Name, cfg.Nodes[ni].Name)
				}
				continue
			}
			where[ep.IP] = ni
			cfg.Nodes[ni].Endpoints = append(cfg.Nodes[ni].Endpoints, ep.IP)
		}
	}
	for i := range cfg.Nodes {
		slices.SortFunc(cfg.Nodes[i].Endpoints, netip.Addr.Compare)
	}
	return nil
}

func placeClients(cfg *Config, clients []scenario.Client, index map[string]int) error {
	used := map[netip.Addr]bool{}
	for _, n := range cfg.Nodes {
		used[n.Addr.Addr()] = true
		for _, a := range n.Endpoints {
			used[a] = true
		}
	}
	next := make([]netip.Addr, len(cfg.Nodes))
	for i, n := range cfg.Nodes {
		next[i] = lastHost(n.PodCIDR)
	}
	for ci, c := range clients {
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
				cc := ClientConfig{Group: c.Name, Index: p}
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

// lastHost is the highest address of p below its broadcast address.
func lastHost(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= (1 << (32 - p.Bits())) - 1
	v--
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Validate checks what a Topology needs of a Config: a run ID, distinct node
// names and labels, IPv4 addresses, gateways inside their pod blocks,
// addresses used once, link indexes within IFNAMSIZ.
func (c *Config) Validate() error {
	if !ValidRunID(c.RunID) {
		return fmt.Errorf("invalid topology: run id %q is not %d lower-case hex characters", c.RunID, RunIDLen)
	}
	if len(c.Nodes) == 0 {
		return errors.New("invalid topology: no node")
	}
	if len(c.Nodes) > maxLinkIndex {
		return fmt.Errorf("invalid topology: %d nodes, at most %d", len(c.Nodes), maxLinkIndex)
	}
	labels := map[string]string{}
	owner := map[netip.Addr]string{}
	claim := func(a netip.Addr, what string) error {
		if !a.Is4() {
			return fmt.Errorf("invalid topology: %s address %v is not IPv4", what, a)
		}
		if prev, ok := owner[a]; ok {
			return fmt.Errorf("invalid topology: address %s is both %s and %s", a, prev, what)
		}
		owner[a] = what
		return nil
	}
	for _, n := range c.Nodes {
		l := Label(n.Name)
		if prev, ok := labels[l]; ok {
			return fmt.Errorf("invalid topology: nodes %s and %s have the same label %s", prev, n.Name, l)
		}
		labels[l] = n.Name
		if err := claim(n.Addr.Addr(), "node "+n.Name); err != nil {
			return err
		}
		if !n.PodCIDR.Contains(n.Gateway) {
			return fmt.Errorf("invalid topology: node %s's gateway %v is outside its pod CIDR %v", n.Name, n.Gateway, n.PodCIDR)
		}
		if err := claim(n.Gateway, "node "+n.Name+"'s gateway"); err != nil {
			return err
		}
		for _, a := range n.Endpoints {
			if err := claim(a, "an endpoint on "+n.Name); err != nil {
				return err
			}
		}
		if len(n.Clients) > maxLinkIndex+1 {
			return fmt.Errorf("invalid topology: node %s has %d client pods, at most %d", n.Name, len(n.Clients), maxLinkIndex+1)
		}
		names := map[string]bool{}
		for _, cl := range n.Clients {
			if len(cl.Addrs) == 0 {
				return fmt.Errorf("invalid topology: client %s-%d on %s has no address", cl.Group, cl.Index, n.Name)
			}
			ns := ClientName(c.RunID, n.Name, cl.Group, cl.Index)
			if names[ns] {
				return fmt.Errorf("invalid topology: two client pods on %s are named %s", n.Name, ns)
			}
			names[ns] = true
			for _, a := range cl.Addrs {
				if !n.PodCIDR.Contains(a) {
					return fmt.Errorf("invalid topology: client %s-%d address %s is outside node %s's pod CIDR %s", cl.Group, cl.Index, a, n.Name, n.PodCIDR)
				}
				if err := claim(a, fmt.Sprintf("client %s-%d on %s", cl.Group, cl.Index, n.Name)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// NamespaceNames lists every namespace name the config creates, fabric first,
// then per node: node, backends, clients.
func (c *Config) NamespaceNames() []string {
	out := []string{FabricName(c.RunID)}
	for _, n := range c.Nodes {
		out = append(out, NodeName(c.RunID, n.Name), BackendName(c.RunID, n.Name))
		for _, cl := range n.Clients {
			out = append(out, ClientName(c.RunID, n.Name, cl.Group, cl.Index))
		}
	}
	return out
}
