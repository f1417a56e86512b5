package cluster

import (
	"fmt"
	"net/netip"
)

// Where is where a client stands. It is the one notion of a client that the
// topology (which namespace it is), the prober (where it sends from), the
// oracle (what must happen to its connections) and the simulator share: a
// proxy treats a connection by where it comes from, and so does everything
// that models or judges one.
type Where string

// The places a client can stand.
const (
	// InPod is a pod on the pod network: its connections leave through its
	// node, whose rules decide them.
	InPod Where = "pod"
	// OnHost is a process in a node's own network namespace (host
	// network): its connections start on that node.
	OnHost Where = "host"
	// Outside is a machine outside the cluster: its connections enter at a
	// node (the one a node port or route leads to, or the one a load
	// balancer picks), whose rules decide them.
	Outside Where = "external"
)

// Wheres lists the places in the order scenario files document them.
func Wheres() []Where { return []Where{InPod, OnHost, Outside} }

// Valid reports whether w is one of Wheres.
func (w Where) Valid() bool { return w == InPod || w == OnHost || w == Outside }

// Via is the address a client connects to.
type Via string

// The destinations of a service port.
const (
	// ViaClusterIP is the cluster IP and port.
	ViaClusterIP Via = "cluster-ip"
	// ViaNodePort is a node's address and the node port.
	ViaNodePort Via = "node-port"
	// ViaExternalIP is one of spec.externalIPs and the port.
	ViaExternalIP Via = "external-ip"
	// ViaLoadBalancer is a load-balancer ingress address (ipMode VIP) and
	// the port.
	ViaLoadBalancer Via = "load-balancer"
)

// Vias lists the destinations in the order scenario files document them.
func Vias() []Via { return []Via{ViaClusterIP, ViaNodePort, ViaExternalIP, ViaLoadBalancer} }

// Valid reports whether v is one of Vias.
func (v Via) Valid() bool {
	return v == ViaClusterIP || v == ViaNodePort || v == ViaExternalIP || v == ViaLoadBalancer
}

// External reports whether v is one of the service port's external
// destinations (everything but the cluster IP).
func (v Via) External() bool { return v != ViaClusterIP }

// Standpoint is a connection's origin as a node's proxy sees it: where the
// client stands, the node whose rules decide the connection (the pod's or
// host's node, or the node an outside connection enters at) and, where the
// outcome depends on it, the client's address (source ranges, hairpin).
type Standpoint struct {
	Where Where
	Node  string
	Addr  netip.Addr
}

// String is "pod on node-a", "host node-a" or "external via node-a", with
// the address when set.
func (s Standpoint) String() string {
	var out string
	switch s.Where {
	case InPod:
		out = "pod on " + s.Node
	case OnHost:
		out = "host " + s.Node
	case Outside:
		out = "external via " + s.Node
	default:
		out = fmt.Sprintf("%s %s", s.Where, s.Node)
	}
	if s.Addr.IsValid() {
		out += " (" + s.Addr.String() + ")"
	}
	return out
}

// Destinations are the addresses of a service port a client connects to
// through v: the cluster IP, the node port on node (its address given), the
// external IPs, or the load-balancer (VIP) addresses. Empty when the
// service port has none of that kind.
func (p *ServicePort) Destinations(v Via, node netip.Addr) []netip.AddrPort {
	port := uint16(p.Port)
	switch v {
	case ViaClusterIP:
		if p.ClusterIP.IsValid() {
			return []netip.AddrPort{netip.AddrPortFrom(p.ClusterIP, port)}
		}
	case ViaNodePort:
		if p.NodePort != 0 && node.IsValid() {
			return []netip.AddrPort{netip.AddrPortFrom(node, uint16(p.NodePort))}
		}
	case ViaExternalIP:
		out := make([]netip.AddrPort, 0, len(p.ExternalIPs))
		for _, a := range p.ExternalIPs {
			out = append(out, netip.AddrPortFrom(a, port))
		}
		return out
	case ViaLoadBalancer:
		out := make([]netip.AddrPort, 0, len(p.LoadBalancerIPs))
		for _, a := range p.LoadBalancerIPs {
			out = append(out, netip.AddrPortFrom(a, port))
		}
		return out
	}
	return nil
}
