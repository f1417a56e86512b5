package dataplanetest

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kpsim/kpsim/sim/cluster"
)

// UpstreamNode is the node name of kube-proxy's fake proxiers
// (testNodeName); UpstreamNodeIP is its address (testNodeIP).
const (
	UpstreamNode   = "test-node"
	UpstreamNodeIP = "192.168.0.2"
)

// OverallObjects are the Services and EndpointSlices of kube-proxy's
// TestOverallIPTablesRules and TestOverallNFTablesRules (v1.37.2), as API
// objects: svc1 ClusterIP; svc2 LoadBalancer with externalTrafficPolicy
// Local, an external IP, ingress 1.2.3.4 and a healthCheckNodePort, its one
// endpoint on no node; svc3 NodePort; svc4 type NodePort without a node
// port but with an external IP, one endpoint on this node; svc5
// LoadBalancer, Cluster policy, a source range written with a leading
// space, ClientIP affinity; svc6 ClusterIP without endpoints. The
// iptables test leaves every endpoint but 10.180.0.5 on no node; the
// nftables test (withNodes) puts 10.180.0.1 and 10.180.0.3 on this node and
// 10.180.0.2 and 10.180.0.4 on another.
func OverallObjects() ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	return overallObjects(false)
}

// OverallObjectsWithNodes is TestOverallNFTablesRules' variant of
// OverallObjects: every endpoint names its node.
func OverallObjectsWithNodes() ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	return overallObjects(true)
}

func overallObjects(withNodes bool) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	svc := func(ns, name string, mut func(*corev1.Service)) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, SessionAffinity: corev1.ServiceAffinityNone}}
		mut(s)
		return s
	}
	port := func(np int32) []corev1.ServicePort {
		return []corev1.ServicePort{{Name: "p80", Port: 80, Protocol: corev1.ProtocolTCP, NodePort: np, TargetPort: intstr.FromInt32(80)}}
	}
	svcs := []*corev1.Service{
		svc("ns1", "svc1", func(s *corev1.Service) { s.Spec.ClusterIP = "172.30.0.41"; s.Spec.Ports = port(0) }),
		svc("ns2", "svc2", func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ExternalTrafficPolicy = corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.ClusterIP, s.Spec.Ports = "172.30.0.42", port(3001)
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "1.2.3.4"}}
			s.Spec.ExternalIPs = []string{"192.168.99.22"}
			s.Spec.HealthCheckNodePort = 30000
		}),
		svc("ns3", "svc3", func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ClusterIP, s.Spec.Ports = corev1.ServiceTypeNodePort, "172.30.0.43", port(3003)
		}),
		svc("ns4", "svc4", func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ClusterIP, s.Spec.Ports = corev1.ServiceTypeNodePort, "172.30.0.44", port(0)
			s.Spec.ExternalIPs = []string{"192.168.99.33"}
		}),
		svc("ns5", "svc5", func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ExternalTrafficPolicy = corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyCluster
			s.Spec.ClusterIP, s.Spec.Ports = "172.30.0.45", port(3002)
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "5.6.7.8"}}
			s.Spec.HealthCheckNodePort = 30000
			s.Spec.LoadBalancerSourceRanges = []string{" 203.0.113.0/25"}
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			t := int32(10800)
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &t}}
		}),
		svc("ns6", "svc6", func(s *corev1.Service) { s.Spec.ClusterIP = "172.30.0.46"; s.Spec.Ports = port(0) }),
	}
	slice := func(ns, name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		pn, pp, proto := "p80", int32(80), corev1.ProtocolTCP
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps,
			Ports: []discoveryv1.EndpointPort{{Name: &pn, Port: &pp, Protocol: &proto}}}
	}
	node, other := UpstreamNode, "other-node"
	this, that := (*string)(nil), (*string)(nil)
	if withNodes {
		this, that = &node, &other
	}
	slices := []*discoveryv1.EndpointSlice{
		slice("ns1", "svc1", discoveryv1.Endpoint{Addresses: []string{"10.180.0.1"}, NodeName: this}),
		slice("ns2", "svc2", discoveryv1.Endpoint{Addresses: []string{"10.180.0.2"}, NodeName: that}),
		slice("ns3", "svc3", discoveryv1.Endpoint{Addresses: []string{"10.180.0.3"}, NodeName: this}),
		slice("ns4", "svc4", discoveryv1.Endpoint{Addresses: []string{"10.180.0.4"}, NodeName: that}, discoveryv1.Endpoint{Addresses: []string{"10.180.0.5"}, NodeName: &node}),
		slice("ns5", "svc5", discoveryv1.Endpoint{Addresses: []string{"10.180.0.3"}, NodeName: this}),
	}
	return svcs, slices
}

// StateOf runs Services and EndpointSlices through a cluster.Tracker (the
// input every backend reads), with a node UpstreamNode at UpstreamNodeIP.
func StateOf(svcs []*corev1.Service, sls []*discoveryv1.EndpointSlice) *cluster.State {
	tr := cluster.NewTracker()
	tr.OnNode(UpstreamNode, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: UpstreamNode},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: UpstreamNodeIP}}}})
	for _, s := range svcs {
		tr.OnService(types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, s)
	}
	for _, sl := range sls {
		tr.OnEndpointSlice(sl.Namespace, sl.Name, sl, sl.Labels[discoveryv1.LabelServiceName])
	}
	st, _ := tr.Drain()
	return st
}

// CanonicalRestore is iptables-restore text in a canonical form for
// comparing two rulesets: per table (sorted), the declared chains sorted,
// then each chain's rules in their order, chains sorted. Counters, blank
// lines and comments (#) are dropped.
func CanonicalRestore(text string) (string, error) {
	type table struct {
		chains map[string]bool
		rules  map[string][]string
	}
	tables := map[string]*table{}
	var cur *table
	for i, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "" || strings.HasPrefix(l, "#") || l == "COMMIT":
		case strings.HasPrefix(l, "*"):
			cur = &table{chains: map[string]bool{}, rules: map[string][]string{}}
			tables[l[1:]] = cur
		case cur == nil:
			return "", fmt.Errorf("line %d: %q outside a table", i+1, l)
		case strings.HasPrefix(l, ":"):
			f := strings.Fields(l[1:])
			cur.chains[f[0]] = true
		case strings.HasPrefix(l, "-A "):
			f := strings.Fields(l)
			if len(f) < 2 {
				return "", fmt.Errorf("line %d: %q", i+1, l)
			}
			cur.rules[f[1]] = append(cur.rules[f[1]], l)
		default:
			return "", fmt.Errorf("line %d: unexpected %q", i+1, l)
		}
	}
	var b strings.Builder
	names := make([]string, 0, len(tables))
	for n := range tables {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t := tables[n]
		fmt.Fprintf(&b, "*%s\n", n)
		chains := make([]string, 0, len(t.chains))
		for c := range t.chains {
			chains = append(chains, c)
		}
		slices.Sort(chains)
		for _, c := range chains {
			fmt.Fprintf(&b, ":%s\n", c)
		}
		ruled := make([]string, 0, len(t.rules))
		for c := range t.rules {
			ruled = append(ruled, c)
		}
		slices.Sort(ruled)
		for _, c := range ruled {
			for _, r := range t.rules[c] {
				b.WriteString(r + "\n")
			}
		}
	}
	return b.String(), nil
}

// BadIPObjects are kube-proxy's TestBadIPs input (v1.37.2): one
// LoadBalancer Service whose addresses and source range have leading zeros
// ("172.30.0.041", "203.0.113.000/025"), which kube-proxy parses sloppily,
// as an API server before 1.33's strict validation stored them. The
// nftables test (withNode) puts the endpoint on this node.
func BadIPObjects(withNode bool) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	pn, pp, proto := "p80", int32(80), corev1.ProtocolTCP
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "svc1"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "172.30.0.041", SessionAffinity: corev1.ServiceAffinityNone,
		ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
		Ports:                 []corev1.ServicePort{{Name: "p80", Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 3001}},
		ExternalIPs:           []string{"192.168.099.022"}, LoadBalancerSourceRanges: []string{"203.0.113.000/025"}}}
	s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "1.2.3.004"}}
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "svc1-1", Labels: map[string]string{discoveryv1.LabelServiceName: "svc1"}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.180.00.001"}}},
		Ports: []discoveryv1.EndpointPort{{Name: &pn, Port: &pp, Protocol: &proto}}}
	if withNode {
		node := UpstreamNode
		sl.Endpoints[0].NodeName = &node
	}
	return []*corev1.Service{s}, []*discoveryv1.EndpointSlice{sl}
}
