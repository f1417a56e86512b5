// Package dataplanetest is the backends' test kit: the fixtures the
// iptables, nftables and IPVS tests share (kube-proxy's test conventions)
// and one golden-file helper with one -update flag. Only _test files import
// it.
package dataplanetest

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Fixture conventions from kube-proxy's tests: pods 10.0.0.0/8, cluster IPs
// 172.30.0.0/16, this node "node1" at 192.168.0.2, another node "node2" at
// 192.168.0.3.
const (
	// ThisNode is the node the proxy under test runs on.
	ThisNode = "node1"
	// OtherNode is another node of the cluster.
	OtherNode = "node2"
)

var (
	// PodCIDR is the cluster's pod range (the local-traffic detector).
	PodCIDR = netip.MustParsePrefix("10.0.0.0/8")
	// NodeIP is ThisNode's address.
	NodeIP = netip.MustParseAddr("192.168.0.2")
	// OtherNodeIP is OtherNode's address.
	OtherNodeIP = netip.MustParseAddr("192.168.0.3")
	// PodIP is a client pod inside PodCIDR.
	PodIP = netip.MustParseAddr("10.0.0.2")
	// ExtIP is a client outside the cluster.
	ExtIP = netip.MustParseAddr("203.0.113.2")
)

// Name is the TCP service port ns/svc:port.
func Name(ns, svc, port string) cluster.ServicePortName {
	return cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: svc}, Port: port, Protocol: corev1.ProtocolTCP}
}

// ClusterIPPort is a ClusterIP service port n at ip:port, target port "80".
func ClusterIPPort(n cluster.ServicePortName, ip string, port int32) *cluster.ServicePort {
	return &cluster.ServicePort{Name: n, Type: corev1.ServiceTypeClusterIP, ClusterIP: netip.MustParseAddr(ip), Port: port, TargetPort: "80"}
}

// EP builds an endpoint; flags: "R" ready, "S" serving, "T" terminating
// (a ready endpoint is serving).
func EP(ip string, port int32, node, flags string) *cluster.Endpoint {
	return &cluster.Endpoint{
		IP: netip.MustParseAddr(ip), Port: port, NodeName: node,
		Ready:       strings.Contains(flags, "R"),
		Serving:     strings.Contains(flags, "R") || strings.Contains(flags, "S"),
		Terminating: strings.Contains(flags, "T"),
	}
}

// NewState is an empty cluster of ThisNode (zone-a) and OtherNode (zone-b).
func NewState() *cluster.State {
	return &cluster.State{
		Services:  map[cluster.ServicePortName]*cluster.ServicePort{},
		Endpoints: map[cluster.ServicePortName][]*cluster.Endpoint{},
		Nodes: map[string]*cluster.Node{
			ThisNode:  {Name: ThisNode, IP: NodeIP, Zone: "zone-a"},
			OtherNode: {Name: OtherNode, IP: OtherNodeIP, Zone: "zone-b"},
		},
	}
}

// Add puts sp into st with eps as its endpoints; without eps the service
// port has no endpoints (any it had are removed).
func Add(st *cluster.State, sp *cluster.ServicePort, eps ...*cluster.Endpoint) {
	st.Services[sp.Name] = sp
	if len(eps) > 0 {
		st.Endpoints[sp.Name] = eps
	} else {
		delete(st.Endpoints, sp.Name)
	}
}

// OverallState is one node's view of a cluster with one Service of each
// kind the backends distinguish (kube-proxy's TestOverallIPTablesRules in
// spirit). A backend's golden test may add to it or adjust one service.
func OverallState() *cluster.State {
	st := NewState()
	// svc1: one endpoint.
	Add(st, ClusterIPPort(Name("ns1", "svc1", "p80"), "172.30.0.41", 80), EP("10.180.0.1", 80, OtherNode, "R"))
	// svc2: three ready endpoints (one local) and one not ready.
	Add(st, ClusterIPPort(Name("ns2", "svc2", "p80"), "172.30.0.42", 80),
		EP("10.180.0.4", 80, OtherNode, "R"), EP("10.180.0.5", 80, ThisNode, "R"), EP("10.180.0.6", 80, ThisNode, ""), EP("10.180.1.7", 80, OtherNode, "R"))
	// svc3: ClientIP affinity.
	sp3 := ClusterIPPort(Name("ns3", "svc3", "p80"), "172.30.0.43", 80)
	sp3.ClientIPAffinity, sp3.AffinityTimeout = true, 10800
	Add(st, sp3, EP("10.180.0.3", 80, OtherNode, "R"), EP("10.180.2.3", 80, ThisNode, "R"))
	// svc4: internalTrafficPolicy Local with a local endpoint.
	sp4 := ClusterIPPort(Name("ns4", "svc4", "p80"), "172.30.0.44", 80)
	sp4.InternalLocal = true
	Add(st, sp4, EP("10.180.0.8", 80, ThisNode, "R"), EP("10.180.0.9", 80, OtherNode, "R"))
	// svc5: internalTrafficPolicy Local without one.
	sp5 := ClusterIPPort(Name("ns5", "svc5", "p80"), "172.30.0.45", 80)
	sp5.InternalLocal = true
	Add(st, sp5, EP("10.180.0.10", 80, OtherNode, "R"))
	// svc6: no endpoints.
	Add(st, ClusterIPPort(Name("ns6", "svc6", "p80"), "172.30.0.46", 80))
	// svc7: only terminating endpoints (one serving, one not).
	Add(st, ClusterIPPort(Name("ns7", "svc7", "p80"), "172.30.0.47", 80),
		EP("10.180.0.11", 80, OtherNode, "ST"), EP("10.180.0.12", 80, OtherNode, "T"))
	// svc8: NodePort, externalTrafficPolicy Local, UDP.
	n8 := Name("ns8", "svc8", "dns")
	n8.Protocol = corev1.ProtocolUDP
	sp8 := ClusterIPPort(n8, "172.30.0.48", 53)
	sp8.Type, sp8.NodePort, sp8.ExternalLocal = corev1.ServiceTypeNodePort, 30053, true
	Add(st, sp8, EP("10.180.0.13", 53, ThisNode, "R"), EP("10.180.0.14", 53, OtherNode, "R"))
	// svc9: NodePort, Cluster policies, unnamed port.
	sp9 := ClusterIPPort(Name("ns9", "svc9", ""), "172.30.0.49", 8080)
	sp9.Type, sp9.NodePort = corev1.ServiceTypeNodePort, 30080
	Add(st, sp9, EP("10.180.0.15", 8080, OtherNode, "R"))
	// svc10: LoadBalancer, externalTrafficPolicy Local with a local
	// endpoint, an external IP, a load-balancer IP and a source range that
	// holds ExtIP but not BlockedIP.
	sp10 := ClusterIPPort(Name("ns10", "svc10", "p80"), "172.30.0.50", 80)
	sp10.Type, sp10.NodePort, sp10.HealthCheckNodePort, sp10.ExternalLocal = corev1.ServiceTypeLoadBalancer, 30010, 30011, true
	sp10.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.168.99.10")}
	sp10.LoadBalancerIPs = []netip.Addr{LBIP}
	sp10.SourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/25")}
	Add(st, sp10, EP("10.180.0.16", 80, ThisNode, "R"), EP("10.180.0.17", 80, OtherNode, "R"))
	// svc11: LoadBalancer, Cluster policy, ClientIP affinity, a
	// load-balancer IP in Proxy mode (no rules) beside a VIP one.
	sp11 := ClusterIPPort(Name("ns11", "svc11", "p80"), "172.30.0.51", 80)
	sp11.Type, sp11.NodePort = corev1.ServiceTypeLoadBalancer, 30012
	sp11.ClientIPAffinity, sp11.AffinityTimeout = true, 10800
	sp11.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("5.6.7.11")}
	sp11.ProxyIPs = []netip.Addr{netip.MustParseAddr("5.6.7.12")}
	Add(st, sp11, EP("10.180.0.18", 80, OtherNode, "R"), EP("10.180.0.19", 80, OtherNode, "R"))
	// svc12: ClusterIP with an external IP and externalTrafficPolicy
	// Local, no local endpoint.
	sp12 := ClusterIPPort(Name("ns12", "svc12", "p80"), "172.30.0.52", 80)
	sp12.ExternalLocal = true
	sp12.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.168.99.12")}
	Add(st, sp12, EP("10.180.0.20", 80, OtherNode, "R"))
	return st
}

// LBIP is svc10's load-balancer IP in OverallState; BlockedIP is a client
// outside its source range (ExtIP is inside it).
var (
	LBIP      = netip.MustParseAddr("1.2.3.10")
	BlockedIP = netip.MustParseAddr("203.0.113.130")
)

// Flow is one flow of a golden trace table: a client to a service port's
// address.
type Flow struct {
	// Name is the service port.
	Name cluster.ServicePortName
	// Src is the client: PodIP, ExtIP or NodeIP.
	Src netip.Addr
	// Proto is "tcp" or "udp".
	Proto string
	// Dst is the cluster IP and port, or NodeIP and the node port.
	Dst netip.AddrPort
}

// String is the flow as a trace table prints it, "ns/svc:port src -> proto
// dst".
func (f Flow) String() string {
	return fmt.Sprintf("%s %s -> %s %s", f.Name, f.Src, f.Proto, f.Dst)
}

// Flows are the flows of a trace table of st: pod, external and host
// clients (and BlockedIP, for a service port with source ranges) to every
// cluster IP, node port, external IP and load-balancer IP (Proxy mode
// ones included: no rule takes them), in service-port order.
func Flows(st *cluster.State) []Flow {
	var out []Flow
	for _, n := range st.SortedServicePorts() {
		sp := st.Services[n]
		dsts := []netip.AddrPort{netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port))}
		if sp.NodePort != 0 {
			dsts = append(dsts, netip.AddrPortFrom(NodeIP, uint16(sp.NodePort)))
		}
		for _, l := range [][]netip.Addr{sp.ExternalIPs, sp.LoadBalancerIPs, sp.ProxyIPs} {
			for _, a := range l {
				dsts = append(dsts, netip.AddrPortFrom(a, uint16(sp.Port)))
			}
		}
		for _, d := range dsts {
			srcs := []netip.Addr{PodIP, ExtIP, NodeIP}
			if len(sp.SourceRanges) > 0 {
				srcs = append(srcs, BlockedIP)
			}
			for _, src := range srcs {
				out = append(out, Flow{Name: n, Src: src, Proto: strings.ToLower(string(n.Protocol)), Dst: d})
			}
		}
	}
	return out
}

// StandpointOf is where a Flow's client stands and the destination kind
// it addresses, in the oracle's terms, on ThisNode: PodIP is a pod, NodeIP
// the host, any other source a client outside the cluster; the
// destination is the cluster IP, a node port, an external IP or a
// load-balancer IP of sp (ok false for one kube-proxy writes no rule for:
// an ipMode Proxy ingress address).
func StandpointOf(f Flow, sp *cluster.ServicePort) (cluster.Standpoint, cluster.Via, bool) {
	from := cluster.Standpoint{Where: cluster.Outside, Node: ThisNode, Addr: f.Src}
	switch f.Src {
	case PodIP:
		from.Where = cluster.InPod
	case NodeIP:
		from.Where = cluster.OnHost
	}
	d := f.Dst.Addr()
	switch {
	case d == sp.ClusterIP:
		return from, cluster.ViaClusterIP, true
	case d == NodeIP:
		return from, cluster.ViaNodePort, true
	case slices.Contains(sp.ExternalIPs, d):
		return from, cluster.ViaExternalIP, true
	case slices.Contains(sp.LoadBalancerIPs, d):
		return from, cluster.ViaLoadBalancer, true
	}
	return from, "", false
}
