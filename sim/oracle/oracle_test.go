package oracle

import (
	"math"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/cluster"
)

// The fixtures follow kube-proxy's tests (reference §4.3): the client runs
// on testHostname; service 172.30.1.1:80; endpoints 10.0.1.x:80.
const (
	testHostname = "test-hostname"
	otherNode    = "host1"
)

var allModes = []cluster.Mode{"", cluster.ModeIPTables, cluster.ModeNFTables, cluster.ModeIPVS}

func svcPort(typ corev1.ServiceType) *cluster.ServicePort {
	return &cluster.ServicePort{
		Name:      cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns1", Name: "svc1"}, Port: "p80", Protocol: corev1.ProtocolTCP},
		Type:      typ,
		ClusterIP: netip.MustParseAddr("172.30.1.1"),
		Port:      80,
	}
}

// ep builds an endpoint from a compact spec: "R" ready, "S" serving, "T"
// terminating, each present or not, as in the reference's table.
func ep(ip, conds, node string) *cluster.Endpoint {
	return &cluster.Endpoint{
		IP:          netip.MustParseAddr(ip),
		Port:        80,
		Ready:       strings.Contains(conds, "R"),
		Serving:     strings.Contains(conds, "S"),
		Terminating: strings.Contains(conds, "T"),
		NodeName:    node,
	}
}

func TestInternalTrafficPolicy(t *testing.T) {
	// kube-proxy TestInternalTrafficPolicy (iptables and nftables), pod
	// 10.0.0.2 → 172.30.1.1:80.
	cases := []struct {
		name  string
		local bool
		eps   []*cluster.Endpoint
		want  string // iptables, nftables and the documentation
		ipvs  string
	}{
		{"cluster", false, []*cluster.Endpoint{ep("10.0.1.1", "RS", testHostname), ep("10.0.1.2", "RS", "host1"), ep("10.0.1.3", "RS", "host2")},
			"10.0.1.1:80, 10.0.1.2:80, 10.0.1.3:80", "10.0.1.1:80, 10.0.1.2:80, 10.0.1.3:80"},
		{"local, one local endpoint", true, []*cluster.Endpoint{ep("10.0.1.1", "RS", testHostname), ep("10.0.1.2", "RS", "host1"), ep("10.0.1.3", "RS", "host2")},
			"10.0.1.1:80", "10.0.1.1:80"},
		{"local, two local endpoints", true, []*cluster.Endpoint{ep("10.0.1.1", "RS", testHostname), ep("10.0.1.2", "RS", testHostname), ep("10.0.1.3", "RS", "host2")},
			"10.0.1.1:80, 10.0.1.2:80", "10.0.1.1:80, 10.0.1.2:80"},
		{"local, no local endpoint", true, []*cluster.Endpoint{ep("10.0.1.1", "RS", "host0"), ep("10.0.1.2", "RS", "host1"), ep("10.0.1.3", "RS", "host2")},
			"DROP", "REJECT"},
	}
	for _, c := range cases {
		for _, mode := range allModes {
			sp := svcPort(corev1.ServiceTypeClusterIP)
			sp.InternalLocal = c.local
			got := Expect(mode, sp, c.eps, testHostname, "")
			want := c.want
			if mode == cluster.ModeIPVS {
				want = c.ipvs
			}
			if got.String() != want {
				t.Errorf("%s [%q]: got %s, want %s", c.name, mode, got, want)
			}
			deviates := mode == cluster.ModeIPVS && c.want == "DROP"
			if hasDeviation(got, "ipvs: internalTrafficPolicy Local") != deviates {
				t.Errorf("%s [%q]: deviations %q, want the ipvs deviation noted: %v", c.name, mode, got.Deviations, deviates)
			}
		}
	}
}

func TestIPVSLocalFallbackForExternallyAccessible(t *testing.T) {
	// kube-proxy's ipvs syncEndpoint falls back to the cluster's endpoints
	// (PR #97081), which CategorizeEndpoints computes only for a service
	// port reachable from outside.
	eps := []*cluster.Endpoint{ep("10.0.1.1", "RS", "host0"), ep("10.0.1.2", "RS", "host1")}
	sp := svcPort(corev1.ServiceTypeNodePort)
	sp.NodePort, sp.InternalLocal = 30080, true
	got := Expect(cluster.ModeIPVS, sp, eps, testHostname, "")
	if got.String() != "10.0.1.1:80, 10.0.1.2:80" || !hasDeviation(got, "falls back") {
		t.Errorf("got %s %q", got, got.Deviations)
	}
	if got := Expect(cluster.ModeIPTables, sp, eps, testHostname, ""); got.Kind != Drop {
		t.Errorf("iptables: %s", got)
	}
}

// TestIPVSLocalNoNodePort: the type alone does not make a service port
// reachable from outside. A NodePort or LoadBalancer port without a node
// port (the API server allocates one, except for a LoadBalancer with
// allocateLoadBalancerNodePorts false) has no cluster set to fall back to.
func TestIPVSLocalNoNodePort(t *testing.T) {
	eps := []*cluster.Endpoint{ep("10.0.1.1", "RS", "host0"), ep("10.0.1.2", "RS", "host1")}
	for _, typ := range []corev1.ServiceType{corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer} {
		sp := svcPort(typ)
		sp.InternalLocal = true
		if got := Expect(cluster.ModeIPVS, sp, eps, testHostname, ""); got.Kind != Reject || !hasDeviation(got, "without real servers") {
			t.Errorf("%s without node port: got %s %q, want REJECT with the ipvs deviation", typ, got, got.Deviations)
		}
	}
}

// TestTerminatingEndpoints runs the reference vectors with traffic outcomes
// (harness/testenv/testdata/vectors.yaml: kube-proxy's
// TestTerminatingEndpointsTrafficPolicyLocal/Cluster and the
// internalTrafficPolicy cases) through the oracle in every mode: pod to the
// cluster IP and, where the case has one, external to the node port. Every
// case is followed by "after endpoints deleted": REJECT for both.
func TestTerminatingEndpoints(t *testing.T) {
	for _, c := range testenv.TrafficVectors(t) {
		sp, eps := vectorPort(c.Service), vectorEndpoints(c.Endpoints)
		for _, mode := range allModes {
			want := c.Outcomes(string(mode))
			if got := Expect(mode, sp, eps, testHostname, c.Zone); got.String() != want.Pod {
				t.Errorf("%s [%q] pod→ClusterIP: got %s, want %s", c.Name, mode, got, want.Pod)
			}
			// after endpoints deleted
			if got := Expect(mode, sp, nil, testHostname, c.Zone); got.Kind != Reject {
				t.Errorf("%s [%q] after delete, pod: got %s, want REJECT", c.Name, mode, got)
			}
			if want.External == "" {
				continue
			}
			if got := ExpectExternal(mode, sp, eps, testHostname, c.Zone); got.String() != want.External {
				t.Errorf("%s [%q] external→node port: got %s, want %s", c.Name, mode, got, want.External)
			}
			if got := ExpectExternal(mode, sp, nil, testHostname, c.Zone); got.Kind != Reject {
				t.Errorf("%s [%q] after delete, external: got %s, want REJECT", c.Name, mode, got)
			}
		}
	}
}

// vectorPort is the reference vectors' service port 172.30.1.1:80.
func vectorPort(s testenv.VectorService) *cluster.ServicePort {
	sp := svcPort(corev1.ServiceType(s.Type))
	sp.NodePort, sp.InternalLocal, sp.ExternalLocal = s.NodePort, s.InternalLocal, s.ExternalLocal
	return sp
}

// vectorEndpoints are a reference vector's endpoints, "local" ones on
// testHostname, "remote" ones on otherNode.
func vectorEndpoints(ves []testenv.VectorEndpoint) []*cluster.Endpoint {
	var eps []*cluster.Endpoint
	for _, v := range ves {
		node := otherNode
		if v.Local() {
			node = testHostname
		}
		e := ep(v.IP, v.Cond, node)
		e.ZoneHints = v.ZoneHints
		eps = append(eps, e)
	}
	return eps
}

func TestIPVSExternalLocalNoLocalEndpoint(t *testing.T) {
	sp := svcPort(corev1.ServiceTypeLoadBalancer)
	sp.ExternalLocal = true
	got := ExpectExternal(cluster.ModeIPVS, sp, []*cluster.Endpoint{ep("10.0.1.5", "RS", otherNode)}, testHostname, "")
	if got.String() != "10.0.1.5:80" || !got.RepliesLost || !hasDeviation(got, "without SNAT") {
		t.Errorf("got %s %q (replies lost %v), want the cluster's endpoint, replies lost, with the ipvs deviation", got, got.Deviations, got.RepliesLost)
	}
}

func TestLocalTerminatingFallbackIsPerSet(t *testing.T) {
	// Local uses local serving-terminating endpoints even though ready ones
	// exist elsewhere; Cluster uses the ready ones.
	eps := []*cluster.Endpoint{ep("10.0.1.1", "ST", testHostname), ep("10.0.1.2", "RS", otherNode)}
	sp := svcPort(corev1.ServiceTypeClusterIP)
	sp.InternalLocal = true
	if got := Expect(cluster.ModeIPTables, sp, eps, testHostname, ""); got.String() != "10.0.1.1:80" {
		t.Errorf("local: got %s", got)
	}
	sp.InternalLocal = false
	if got := Expect(cluster.ModeIPTables, sp, eps, testHostname, ""); got.String() != "10.0.1.2:80" {
		t.Errorf("cluster: got %s", got)
	}
}

func TestTopologyHints(t *testing.T) {
	hinted := func(ip, node string, zones, nodes []string) *cluster.Endpoint {
		e := ep(ip, "RS", node)
		e.ZoneHints, e.NodeHints = zones, nodes
		return e
	}
	sp := svcPort(corev1.ServiceTypeClusterIP)
	eps := []*cluster.Endpoint{
		hinted("10.0.1.1", "a1", []string{"a"}, []string{"a1"}),
		hinted("10.0.1.2", "b1", []string{"b"}, []string{"b1"}),
		hinted("10.0.1.3", "b2", []string{"b"}, []string{"b2"}),
	}
	cases := []struct {
		name, node, zone string
		sameNode         bool
		eps              []*cluster.Endpoint
		want             string
	}{
		{"zone a", "a9", "a", false, eps, "10.0.1.1:80"},
		{"zone b", "b9", "b", false, eps, "10.0.1.2:80, 10.0.1.3:80"},
		{"zone without hints for it", "c1", "c", false, eps, "10.0.1.1:80, 10.0.1.2:80, 10.0.1.3:80"},
		{"node hints off", "b2", "b", false, eps, "10.0.1.2:80, 10.0.1.3:80"},
		{"node hints on", "b2", "b", true, eps, "10.0.1.3:80"},
		{"node hints on, none for this node", "b9", "b", true, eps, "10.0.1.2:80, 10.0.1.3:80"},
		{"one ready endpoint without hints", "a1", "a", false, append([]*cluster.Endpoint{ep("10.0.1.4", "RS", "a1")}, eps...), "10.0.1.1:80, 10.0.1.2:80, 10.0.1.3:80, 10.0.1.4:80"},
		{"not-ready endpoint without hints does not count", "a1", "a", false, append([]*cluster.Endpoint{ep("10.0.1.4", "S", "a1")}, eps...), "10.0.1.1:80"},
	}
	for _, c := range cases {
		o := Oracle{PreferSameNode: c.sameNode}
		if got := o.Expect(cluster.ModeNFTables, sp, c.eps, c.node, c.zone); got.String() != c.want {
			t.Errorf("%s: got %s, want %s", c.name, got, c.want)
		}
	}
}

func TestUniformProbabilities(t *testing.T) {
	var eps []*cluster.Endpoint
	for _, ip := range []string{"10.0.1.1", "10.0.1.2", "10.0.1.3", "10.0.1.4", "10.0.1.5", "10.0.1.6", "10.0.1.7"} {
		eps = append(eps, ep(ip, "RS", otherNode))
	}
	eps = append(eps, ep("10.0.1.8", "", otherNode), ep("10.0.1.9", "ST", otherNode))
	got := Expect(cluster.ModeIPTables, svcPort(corev1.ServiceTypeClusterIP), eps, testHostname, "")
	if got.Kind != Endpoints || len(got.Probs) != 7 {
		t.Fatalf("got %s", got)
	}
	sum := 0.0
	for k, p := range got.Probs {
		if math.Abs(p-1.0/7) > 1e-15 {
			t.Errorf("%s: p = %v", k, p)
		}
		sum += p
	}
	if math.Abs(sum-1) > 1e-12 {
		t.Errorf("sum = %v", sum)
	}
	if got.Allows("10.0.1.8:80") || got.Allows("10.0.1.9:80") {
		t.Errorf("not-ready endpoints allowed: %s", got)
	}
}

func TestModeDeviations(t *testing.T) {
	sp := svcPort(corev1.ServiceTypeClusterIP)
	sp.ClientIPAffinity, sp.AffinityTimeout = true, 10800
	eps := []*cluster.Endpoint{ep("10.0.1.1", "RS", otherNode)}
	if got := Expect(cluster.ModeIPTables, sp, eps, testHostname, ""); !hasDeviation(got, "recent list") {
		t.Errorf("iptables: %q", got.Deviations)
	}
	if got := Expect(cluster.ModeIPVS, sp, eps, testHostname, ""); !hasDeviation(got, "89358") {
		t.Errorf("ipvs: %q", got.Deviations)
	}
	if got := Expect(cluster.ModeNFTables, sp, eps, testHostname, ""); len(got.Deviations) != 0 {
		t.Errorf("nftables: %q", got.Deviations)
	}
	if got := (Oracle{IPVSScheduler: "dh"}).Expect(cluster.ModeIPVS, svcPort(corev1.ServiceTypeClusterIP), eps, testHostname, ""); !hasDeviation(got, "dh") {
		t.Errorf("ipvs dh: %q", got.Deviations)
	}
}

func hasDeviation(o Outcome, sub string) bool {
	for _, d := range o.Deviations {
		if strings.Contains(d, sub) {
			return true
		}
	}
	return false
}

func TestTracePacketVectors(t *testing.T) {
	// kube-proxy TestTracePacket / TestOverallIPTablesRules services
	// (reference §4.3): the node is testHostname (192.168.0.2); endpoints
	// 10.180.0.x are on other nodes unless said.
	mk := func(name string, typ corev1.ServiceType, ips ...string) (*cluster.ServicePort, []*cluster.Endpoint) {
		s := svcPort(typ)
		s.Name.Name = name
		var eps []*cluster.Endpoint
		for _, ip := range ips {
			eps = append(eps, ep(ip, "RS", otherNode))
		}
		return s, eps
	}
	svc1, eps1 := mk("svc1", corev1.ServiceTypeClusterIP, "10.180.0.1")
	svc2, eps2 := mk("svc2", corev1.ServiceTypeLoadBalancer, "10.180.0.2")
	svc2.ExternalLocal, svc2.NodePort = true, 3001
	svc4, eps4 := mk("svc4", corev1.ServiceTypeClusterIP, "10.180.0.4", "10.180.0.5")
	svc6, _ := mk("svc6", corev1.ServiceTypeClusterIP)
	for _, mode := range []cluster.Mode{"", cluster.ModeIPTables, cluster.ModeNFTables} {
		for _, c := range []struct {
			name string
			got  Outcome
			want string
		}{
			{"single endpoint: 10.0.0.2 → 172.30.0.41:80", Expect(mode, svc1, eps1, testHostname, ""), "10.180.0.1:80"},
			{"multiple endpoints: 10.0.0.2 → 172.30.0.44:80", Expect(mode, svc4, eps4, testHostname, ""), "10.180.0.4:80, 10.180.0.5:80"},
			{"LOCAL: 192.168.0.2 → 192.168.99.22:80 (ETP Local, endpoint remote)", ExpectShortCircuit(mode, svc2, eps2, testHostname, ""), "10.180.0.2:80"},
			{"pod to nodePort: 10.0.0.2 → 192.168.0.2:3001", ExpectShortCircuit(mode, svc2, eps2, testHostname, ""), "10.180.0.2:80"},
			{"DROP: 203.0.113.2 → 192.168.99.22:80", ExpectExternal(mode, svc2, eps2, testHostname, ""), "DROP"},
			{"REJECT: 10.0.0.2 → 172.30.0.46:80", Expect(mode, svc6, nil, testHostname, ""), "REJECT"},
			{"no endpoints, pod → nodePort", ExpectShortCircuit(mode, svc2, nil, testHostname, ""), "REJECT"},
			{"no endpoints, external → LB", ExpectExternal(mode, svc2, nil, testHostname, ""), "REJECT"},
		} {
			if c.got.String() != c.want {
				t.Errorf("%s [%q]: got %s, want %s", c.name, mode, c.got, c.want)
			}
		}
	}
	// Not modelled: ACCEPT for the health-check node port, and
	// loadBalancerSourceRanges (ServicePort does not carry them).
}
