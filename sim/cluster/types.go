// Package cluster is the model every part reads: per service port the
// Service's settings and its endpoints with their conditions and placement,
// the nodes, and a change tracker that turns Service, EndpointSlice and Node
// objects into that state and its change sets, as kube-proxy's
// ServiceChangeTracker and EndpointsChangeTracker do.
//
// It is a leaf: it depends on k8s.io/api and apimachinery only, so the oracle,
// the simulator's engines and the real dataplane link it without a clientset.
// sim/apiserver holds the objects in client-go's fake clientset and feeds a
// Tracker from its informers.
package cluster

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ServicePortName identifies a service port as kube-proxy does:
// namespace/name:port, with the protocol beside it.
type ServicePortName struct {
	types.NamespacedName
	Port     string
	Protocol corev1.Protocol
}

// String is "namespace/name:port", or "namespace/name" for an unnamed port,
// exactly kube-proxy's ServicePortName.String().
func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.Namespace + "/" + n.Name
	}
	return fmt.Sprintf("%s/%s:%s", n.Namespace, n.Name, n.Port)
}

// ServicePort is one port of a Service with the settings kube-proxy programs.
type ServicePort struct {
	Name             ServicePortName
	Type             corev1.ServiceType
	ClusterIP        netip.Addr
	Port             int32
	NodePort         int32
	TargetPort       string // a number or a port name, for display
	ClientIPAffinity bool
	// AffinityTimeout is the ClientIP timeout in seconds (when affinity is on).
	AffinityTimeout int32
	InternalLocal   bool
	ExternalLocal   bool
	// Headless Services (clusterIP None) are not load-balanced.
	Headless bool
	// HealthCheckNodePort is the Service's healthCheckNodePort where
	// kube-proxy uses it (type LoadBalancer with externalTrafficPolicy
	// Local), else 0.
	HealthCheckNodePort int32
	// ExternalIPs are the Service's spec.externalIPs of the IPv4 family,
	// in the Service's order (kube-proxy's ExternalIPs()).
	ExternalIPs []netip.Addr
	// LoadBalancerIPs are the IPv4 addresses of status.loadBalancer.ingress
	// whose ipMode is VIP (or unset): the destinations kube-proxy captures
	// (LoadBalancerVIPs()).
	LoadBalancerIPs []netip.Addr
	// ProxyIPs are the ingress addresses with ipMode Proxy: the balancer
	// proxies to node ports, and kube-proxy writes no rule for them.
	ProxyIPs []netip.Addr
	// SourceRanges are the IPv4 loadBalancerSourceRanges, trimmed and in
	// order; empty when the Service has none or one of them is a zero CIDR
	// (0.0.0.0/0 allows everything, as kube-proxy reads it).
	SourceRanges []netip.Prefix
}

// Equal reports whether two service ports have the same settings.
func (p *ServicePort) Equal(o *ServicePort) bool {
	return p.Name == o.Name && p.Type == o.Type && p.ClusterIP == o.ClusterIP && p.Port == o.Port && p.NodePort == o.NodePort &&
		p.TargetPort == o.TargetPort && p.ClientIPAffinity == o.ClientIPAffinity && p.AffinityTimeout == o.AffinityTimeout &&
		p.InternalLocal == o.InternalLocal && p.ExternalLocal == o.ExternalLocal && p.Headless == o.Headless &&
		p.HealthCheckNodePort == o.HealthCheckNodePort && slices.Equal(p.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(p.LoadBalancerIPs, o.LoadBalancerIPs) && slices.Equal(p.ProxyIPs, o.ProxyIPs) && slices.Equal(p.SourceRanges, o.SourceRanges)
}

// Endpoint is one backend of a service port, with its EndpointSlice
// conditions. Nil conditions are read as kube-proxy reads them: ready nil ⇒
// ready; serving nil ⇒ serving; terminating nil ⇒ not terminating.
type Endpoint struct {
	IP          netip.Addr
	Port        int32
	Ready       bool
	Serving     bool
	Terminating bool
	NodeName    string
	Zone        string
	ZoneHints   []string
	NodeHints   []string
	// Pod is the targetRef's name, when there is one.
	Pod string
}

// String is "ip:port", kube-proxy's endpoint key.
func (e *Endpoint) String() string { return netip.AddrPortFrom(e.IP, uint16(e.Port)).String() }

// CompareEndpointStrings orders endpoints by their "ip:port" strings,
// strings.Compare(a.String(), b.String()), without making the strings:
// sorting and checking the order of every Service's endpoints made two per
// comparison, a large part of loading 30,000 Services.
func CompareEndpointStrings(a, b *Endpoint) int {
	var ab, bb [64]byte
	as := netip.AddrPortFrom(a.IP, uint16(a.Port)).AppendTo(ab[:0])
	bs := netip.AddrPortFrom(b.IP, uint16(b.Port)).AppendTo(bb[:0])
	return bytes.Compare(as, bs)
}

func (e *Endpoint) equal(o *Endpoint) bool {
	return e.IP == o.IP && e.Port == o.Port && e.Ready == o.Ready && e.Serving == o.Serving &&
		e.Terminating == o.Terminating && e.NodeName == o.NodeName && e.Zone == o.Zone && e.Pod == o.Pod &&
		slices.Equal(e.ZoneHints, o.ZoneHints) && slices.Equal(e.NodeHints, o.NodeHints)
}

// Node is what the proxy needs of a node.
type Node struct {
	Name    string
	Zone    string
	IP      netip.Addr
	PodCIDR netip.Prefix
	Labels  map[string]string
	// Leaving reports a node being deleted (deletionTimestamp set) or
	// tainted ToBeDeletedByClusterAutoscaler: kube-proxy's /healthz then
	// answers 503, so that load balancers drain it (NodeEligible).
	Leaving bool
}

// Changes names the service ports whose Service or endpoints changed since the
// previous Drain. No-op updates (an object rewritten with the same content as
// far as the proxy is concerned) are not listed.
type Changes struct {
	Services  []ServicePortName // settings changed, added or removed
	Endpoints []ServicePortName // endpoint set or conditions changed
	Nodes     bool              // a node's zone, address or pod CIDR changed, or a node came or went
	// TriggerTimes are the last-change-trigger-time annotations of the
	// drained EndpointSlice changes, one per Service: the start of the
	// network programming latency a sync ends.
	TriggerTimes []time.Time
	// Seq is the tracker's event count at this Drain.
	Seq uint64
}

// Empty reports whether nothing changed.
func (c *Changes) Empty() bool { return len(c.Services) == 0 && len(c.Endpoints) == 0 && !c.Nodes }

// All is the union of changed service ports, sorted.
func (c *Changes) All() []ServicePortName {
	seen := map[ServicePortName]bool{}
	var out []ServicePortName
	for _, l := range [][]ServicePortName{c.Services, c.Endpoints} {
		for _, n := range l {
			if !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	SortNames(out)
	return out
}

// SortNames sorts service port names by namespace, name, port, protocol.
func SortNames(l []ServicePortName) {
	slices.SortFunc(l, CompareNames)
}

// CompareNames orders service port names.
func CompareNames(a, b ServicePortName) int {
	switch {
	case a.Namespace != b.Namespace:
		return cmpStr(a.Namespace, b.Namespace)
	case a.Name != b.Name:
		return cmpStr(a.Name, b.Name)
	case a.Port != b.Port:
		return cmpStr(a.Port, b.Port)
	}
	return cmpStr(string(a.Protocol), string(b.Protocol))
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
