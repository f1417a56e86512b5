package proxy

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/cluster"
)

const (
	here  = "node1"
	there = "node2"
)

// ep builds an endpoint 10.0.1.<last>:80; flags "R" ready, "S" serving,
// "T" terminating (ready implies serving).
func ep(last string, node, flags string, zoneHints ...string) *cluster.Endpoint {
	return &cluster.Endpoint{
		IP: netip.MustParseAddr("10.0.1." + last), Port: 80, NodeName: node,
		Ready:       strings.Contains(flags, "R"),
		Serving:     strings.Contains(flags, "R") || strings.Contains(flags, "S"),
		Terminating: strings.Contains(flags, "T"),
		ZoneHints:   zoneHints,
	}
}

func port(itp, etp bool, nodePort int32) *cluster.ServicePort {
	sp := &cluster.ServicePort{
		Name:      cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "svc"}, Protocol: corev1.ProtocolTCP},
		Type:      corev1.ServiceTypeClusterIP,
		ClusterIP: netip.MustParseAddr("172.30.1.1"), Port: 80,
		InternalLocal: itp, ExternalLocal: etp,
	}
	if nodePort != 0 {
		sp.Type, sp.NodePort = corev1.ServiceTypeNodePort, nodePort
	}
	return sp
}

// typed sets the Service type of sp, whatever its node port: the API server
// never leaves a NodePort port without one, but the predicates must still
// read such a port as not reachable from outside.
func typed(typ corev1.ServiceType, sp *cluster.ServicePort) *cluster.ServicePort {
	sp.Type = typ
	return sp
}

func ips(eps []*cluster.Endpoint) string {
	var out []string
	for _, e := range eps {
		out = append(out, e.IP.String())
	}
	return strings.Join(out, ",")
}

// TestCategorize runs the reference vectors with eligibility expectations
// (harness/testenv/testdata/vectors.yaml: kube-proxy's
// TestCategorizeEndpoints cases and the terminating-endpoint tables of
// reference §4.3).
func TestCategorize(t *testing.T) {
	for _, c := range testenv.ReferenceVectors(t) {
		if c.Eligibility == nil {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			sp := port(c.Service.InternalLocal, c.Service.ExternalLocal, c.Service.NodePort)
			sp.Type = corev1.ServiceType(c.Service.Type)
			var eps []*cluster.Endpoint
			for _, v := range c.Endpoints {
				node := there
				if v.Local() {
					node = here
				}
				e := ep("0", node, v.Cond, v.ZoneHints...)
				e.IP = netip.MustParseAddr(v.IP)
				eps = append(eps, e)
			}
			want := c.Eligibility
			got := Categorize(eps, sp, here, c.Zone)
			wc, wl, wr := strings.Join(want.Cluster, ","), strings.Join(want.Local, ","), strings.Join(want.Reachable, ",")
			if ips(got.Cluster) != wc || ips(got.Local) != wl || ips(got.AllReachable) != wr {
				t.Errorf("cluster %q local %q reachable %q, want %q %q %q",
					ips(got.Cluster), ips(got.Local), ips(got.AllReachable), wc, wl, wr)
			}
			if got.HasAny != want.HasAny || got.Topology != want.Topology {
				t.Errorf("hasAny %v topology %q, want %v %q", got.HasAny, got.Topology, want.HasAny, want.Topology)
			}
		})
	}
}

func TestPreferSameNode(t *testing.T) {
	a, b := ep("1", here, "R", "zone-a"), ep("2", there, "R", "zone-a")
	a.NodeHints, b.NodeHints = []string{here}, []string{there}
	sp := port(false, false, 0)
	if got := Categorize([]*cluster.Endpoint{a, b}, sp, here, "zone-a"); ips(got.Cluster) != "10.0.1.1,10.0.1.2" {
		t.Errorf("gate off: %s", ips(got.Cluster))
	}
	c := Categorizer{Node: here, Zone: "zone-a", PreferSameNode: true}
	if got := c.Categorize([]*cluster.Endpoint{a, b}, sp); ips(got.Cluster) != "10.0.1.1" || got.Topology != TopologyPreferSameNode {
		t.Errorf("gate on: %s %s", ips(got.Cluster), got.Topology)
	}
}

func TestPolicySelection(t *testing.T) {
	eps := []*cluster.Endpoint{ep("1", here, "R"), ep("5", there, "R")}
	sp := port(true, false, 0)
	got := Categorize(eps, sp, here, "")
	if ips(got.Internal(sp)) != "10.0.1.1" || !got.Roles(sp).HasInternal || got.Roles(sp).UsesExtChain {
		t.Errorf("itp local: internal %s", ips(got.Internal(sp)))
	}
	sp = port(false, true, 30001)
	got = Categorize(eps, sp, there+"x", "")
	if ips(got.Internal(sp)) != "10.0.1.1,10.0.1.5" || got.Roles(sp).HasExternal || ips(got.External(sp)) != "" {
		t.Errorf("etp local on a node without endpoints: internal %s external %s", ips(got.Internal(sp)), ips(got.External(sp)))
	}
	if !ExternallyAccessible(sp) || !ExternalPolicyLocal(sp) || !UsesClusterEndpoints(sp) || !UsesLocalEndpoints(sp) {
		t.Error("policy predicates wrong for a node port with etp Local")
	}
	for _, typ := range []corev1.ServiceType{corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer} {
		sp = typed(typ, port(true, true, 0))
		if ExternallyAccessible(sp) || ExternalPolicyLocal(sp) || UsesClusterEndpoints(sp) || !UsesLocalEndpoints(sp) {
			t.Errorf("%s without a node port: the predicates read it as reachable from outside", typ)
		}
		got := Categorize(eps, sp, there+"x", "")
		if got.Cluster != nil || got.Roles(sp).HasInternal || !got.HasAny {
			t.Errorf("%s without a node port, itp Local, no local endpoint: cluster %s", typ, ips(got.Cluster))
		}
	}
}

func TestCategorizeFaults(t *testing.T) {
	eps := []*cluster.Endpoint{ep("1", there, "R"), ep("2", there, ""), ep("3", here, "T")}
	c := Categorizer{Node: here, KeepNotReady: true}
	if got := c.Categorize(eps, port(false, false, 0)); ips(got.Cluster) != "10.0.1.1,10.0.1.2,10.0.1.3" {
		t.Errorf("keep-not-ready: %s", ips(got.Cluster))
	}
	c = Categorizer{Node: here, IgnoreLocalPolicy: true}
	if got := c.Categorize(eps, port(true, false, 0)); ips(got.Local) != "10.0.1.1" {
		t.Errorf("ignore-local-policy: %s", ips(got.Local))
	}
}

// TestCategorizeOrder: whatever the input order, the lists come out as
// kube-proxy's EndpointSliceCache orders them, by "ip:port" string (so
// 10.0.1.10 before 10.0.1.2), and the input is left alone.
func TestCategorizeOrder(t *testing.T) {
	in := []*cluster.Endpoint{ep("2", here, "R"), ep("9", there, "R"), ep("10", there, "R"), ep("11", here, "ST")}
	cases := []struct {
		sp                      *cluster.ServicePort
		cluster, local, reached string
	}{
		{port(false, false, 0), "10.0.1.10,10.0.1.2,10.0.1.9", "", "10.0.1.10,10.0.1.2,10.0.1.9"},
		{port(true, false, 0), "", "10.0.1.2", "10.0.1.2"},
		{port(false, true, 30080), "10.0.1.10,10.0.1.2,10.0.1.9", "10.0.1.2", "10.0.1.10,10.0.1.2,10.0.1.9"},
	}
	for _, c := range cases {
		got := Categorize(in, c.sp, here, "")
		if ips(got.Cluster) != c.cluster || ips(got.Local) != c.local || ips(got.AllReachable) != c.reached {
			t.Errorf("itp=%v etp=%v: cluster %s local %s reachable %s, want %s / %s / %s", c.sp.InternalLocal, c.sp.ExternalLocal,
				ips(got.Cluster), ips(got.Local), ips(got.AllReachable), c.cluster, c.local, c.reached)
		}
	}
	if ips(in) != "10.0.1.2,10.0.1.9,10.0.1.10,10.0.1.11" {
		t.Errorf("Categorize reordered its input: %s", ips(in))
	}
	// A terminating local endpoint with no ready local one: the union of
	// Cluster and Local is sorted too.
	in2 := []*cluster.Endpoint{ep("3", there, "R"), ep("20", here, "ST")}
	if got := Categorize(in2, port(false, true, 30080), here, ""); ips(got.AllReachable) != "10.0.1.20,10.0.1.3" {
		t.Errorf("union: %s, want 10.0.1.20,10.0.1.3", ips(got.AllReachable))
	}
}
