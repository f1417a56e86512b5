package netns

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Config is everything a Topology creates. It is plain data, so tests can
// build one by hand; harness/topology derives one from a loaded scenario.
type Config struct {
	// RunID names the run: every name starts with RunPrefix(RunID).
	RunID string
	// Nodes in name order. Node i (0-based) has the fabric port "kp<runid>f<i+1>".
	Nodes []NodeConfig
	// ServiceCIDR is routed out of every node's uplink, as a node's default
	// route would carry it, so that a ClusterIP packet the proxy does not
	// DNAT reaches the FORWARD chain (where kube-proxy drops or rejects it)
	// instead of failing the routing lookup. Nothing answers there.
	ServiceCIDR netip.Prefix
	// ControlPlane, when valid, is the address (with its prefix length, e.g.
	// 198.18.255.254/16) of the run's control-plane namespace
	// (ControlPlaneName): one veth port on the fabric bridge, where etcd and
	// kube-apiserver run. Nodes and the control plane reach each other
	// directly on the fabric (a /32 link route when outside each other's
	// prefix). The zero value builds none.
	ControlPlane netip.Prefix
	// Outside, when set, is the world outside the cluster: a router on the
	// fabric, which every node uses as its default gateway, and client
	// namespaces behind it.
	Outside *OutsideConfig
}

// OutsideConfig is the world outside the cluster: a router namespace
// (RouterName) with a port on the fabric and a link to each outside client
// namespace (OutsideName). Nodes route everything they have no other route
// for to it; it forwards to the outside clients and, for addresses routed
// to the cluster later (load-balancer and external IPs: Topology.Route),
// to the nodes. Nothing in it leads anywhere else: it has no route to the
// host.
type OutsideConfig struct {
	// Router is the router's fabric address with the node network's prefix
	// length (a gateway on the nodes' subnet).
	Router netip.Prefix
	// Gateway is the router's address on every client link, each outside
	// client's gateway (as a pod's is its node's).
	Gateway netip.Addr
	// Clients are the outside clients, by group and index; Addrs are
	// their addresses (/32s), the first one the default source.
	Clients []ClientConfig
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
	// Endpoint reports a pod that is also an endpoint: its first address
	// is an endpoint of a Service (not in the node's backend namespace),
	// and traffic to it arrives in this namespace (hairpin).
	Endpoint bool
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
	cl := claims{}
	if c.ControlPlane.IsValid() {
		if err := cl.claim(c.ControlPlane.Addr(), "the control plane"); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		l := Label(n.Name)
		if prev, ok := labels[l]; ok {
			return fmt.Errorf("invalid topology: nodes %s and %s have the same label %s", prev, n.Name, l)
		}
		labels[l] = n.Name
		if err := c.validateNode(n, cl); err != nil {
			return err
		}
	}
	if o := c.Outside; o != nil {
		return c.validateOutside(o, cl)
	}
	return nil
}

// claims records which part of a topology owns each address.
type claims map[netip.Addr]string

// claim gives a to what, refusing a non-IPv4 address and one owned already.
func (cl claims) claim(a netip.Addr, what string) error {
	if !a.Is4() {
		return fmt.Errorf("invalid topology: %s address %v is not IPv4", what, a)
	}
	if prev, ok := cl[a]; ok {
		return fmt.Errorf("invalid topology: address %s is both %s and %s", a, prev, what)
	}
	cl[a] = what
	return nil
}

// validateNode checks one node: its address, gateway, endpoints and client
// pods.
func (c *Config) validateNode(n NodeConfig, cl claims) error {
	if err := cl.claim(n.Addr.Addr(), "node "+n.Name); err != nil {
		return err
	}
	if !n.PodCIDR.Contains(n.Gateway) {
		return fmt.Errorf("invalid topology: node %s's gateway %v is outside its pod CIDR %v", n.Name, n.Gateway, n.PodCIDR)
	}
	if err := cl.claim(n.Gateway, "node "+n.Name+"'s gateway"); err != nil {
		return err
	}
	for _, a := range n.Endpoints {
		if err := cl.claim(a, "an endpoint on "+n.Name); err != nil {
			return err
		}
	}
	if len(n.Clients) > maxLinkIndex+1 {
		return fmt.Errorf("invalid topology: node %s has %d client pods, at most %d", n.Name, len(n.Clients), maxLinkIndex+1)
	}
	names := map[string]bool{}
	for _, p := range n.Clients {
		if p.Endpoint && slices.Contains(n.Endpoints, p.Addrs[0]) {
			return fmt.Errorf("invalid topology: endpoint %s on %s is both a pod of its own and in the backend namespace", p.Addrs[0], n.Name)
		}
		if len(p.Addrs) == 0 {
			return fmt.Errorf("invalid topology: client %s-%d on %s has no address", p.Group, p.Index, n.Name)
		}
		ns := ClientName(c.RunID, n.Name, p.Group, p.Index)
		if names[ns] {
			return fmt.Errorf("invalid topology: two client pods on %s are named %s", n.Name, ns)
		}
		names[ns] = true
		for _, a := range p.Addrs {
			if !n.PodCIDR.Contains(a) {
				return fmt.Errorf("invalid topology: client %s-%d address %s is outside node %s's pod CIDR %s", p.Group, p.Index, a, n.Name, n.PodCIDR)
			}
			if err := cl.claim(a, fmt.Sprintf("client %s-%d on %s", p.Group, p.Index, n.Name)); err != nil {
				return err
			}
		}
	}
	return nil
}

// validateOutside checks the router and the outside clients.
func (c *Config) validateOutside(o *OutsideConfig, cl claims) error {
	if err := cl.claim(o.Router.Addr(), "the router"); err != nil {
		return err
	}
	if err := cl.claim(o.Gateway, "the router's client gateway"); err != nil {
		return err
	}
	if len(o.Clients) > maxLinkIndex+1 {
		return fmt.Errorf("invalid topology: %d outside clients, at most %d", len(o.Clients), maxLinkIndex+1)
	}
	names := map[string]bool{}
	for _, p := range o.Clients {
		if len(p.Addrs) == 0 {
			return fmt.Errorf("invalid topology: outside client %s-%d has no address", p.Group, p.Index)
		}
		ns := OutsideName(c.RunID, p.Group, p.Index)
		if names[ns] {
			return fmt.Errorf("invalid topology: two outside clients are named %s", ns)
		}
		names[ns] = true
		for _, a := range p.Addrs {
			if err := cl.claim(a, fmt.Sprintf("outside client %s-%d", p.Group, p.Index)); err != nil {
				return err
			}
		}
	}
	return nil
}

// NamespaceNames lists every namespace name the config creates, fabric first,
// then the control plane (if any), then per node: node, backends, clients.
func (c *Config) NamespaceNames() []string {
	out := []string{FabricName(c.RunID)}
	if c.ControlPlane.IsValid() {
		out = append(out, ControlPlaneName(c.RunID))
	}
	for _, n := range c.Nodes {
		out = append(out, NodeName(c.RunID, n.Name), BackendName(c.RunID, n.Name))
		for _, cl := range n.Clients {
			out = append(out, ClientName(c.RunID, n.Name, cl.Group, cl.Index))
		}
	}
	if c.Outside != nil {
		out = append(out, RouterName(c.RunID))
		for _, cl := range c.Outside.Clients {
			out = append(out, OutsideName(c.RunID, cl.Group, cl.Index))
		}
	}
	return out
}
