package apiserver

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

func open(t testing.TB, file string) *Model {
	t.Helper()
	m, err := Open(context.Background(), file, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// waitDrain waits until the tracker has received the one event of a
// single API write made when its sequence was before, then drains.
func waitDrain(t *testing.T, tr *cluster.Tracker, before uint64) cluster.Changes {
	t.Helper()
	waitSeq(t, tr, before+1)
	_, ch := tr.Drain()
	return ch
}

func TestOpenDistribution(t *testing.T) {
	m := open(t, "../../scenarios/conformance/distribution.yaml")
	st := m.State
	web := cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: "web"}, Port: "http", Protocol: corev1.ProtocolTCP}
	api := cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: "api"}, Protocol: corev1.ProtocolTCP}
	if got := len(st.Endpoints[web]); got != 3 {
		t.Errorf("web has %d endpoints, want 3", got)
	}
	if got := len(st.Endpoints[api]); got != 5 {
		t.Errorf("api (from a kind: List) has %d endpoints, want 5", got)
	}
	if web.String() != "demo/web:http" || api.String() != "demo/api" {
		t.Errorf("names %q %q", web, api)
	}
	sp := st.Services[web]
	if sp == nil || sp.ClusterIP.String() != "10.96.0.10" || sp.Port != 80 {
		t.Fatalf("service port %+v", sp)
	}
	if e := st.Endpoints[web][2]; e.String() != "10.244.1.10:8080" || e.NodeName != "node-b" || e.Zone != "" || !e.Ready || !e.Serving || e.Terminating {
		t.Errorf("endpoint %+v", e)
	}
	if n := st.Nodes["node-b"]; n == nil || n.Zone != "zone-2" || !n.IP.IsValid() || n.PodCIDR.String() != "10.244.1.0/24" {
		t.Errorf("node %+v", n)
	}
}

// TestTrackerThroughInformers writes through the clientset and checks that the
// tracker names exactly the changed service port, and drops a no-op update.
func TestTrackerThroughInformers(t *testing.T) {
	m := open(t, "../../scenarios/conformance/distribution.yaml")
	ctx := context.Background()
	c := m.Cluster.Client
	web := cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: "web"}, Port: "http", Protocol: corev1.ProtocolTCP}

	slice, err := c.DiscoveryV1().EndpointSlices("demo").Get(ctx, "web-x7k2p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A no-op for the proxy: only an annotation changes.
	noop := slice.DeepCopy()
	noop.Annotations = map[string]string{"touched": "yes"}
	before := m.Tracker.Seq()
	if _, err := c.DiscoveryV1().EndpointSlices("demo").Update(ctx, noop, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if ch := waitDrain(t, m.Tracker, before); !ch.Empty() {
		t.Errorf("a no-op update was reported as a change: %+v", ch)
	}

	// A readiness flip on one endpoint.
	flip := slice.DeepCopy()
	f := false
	flip.Endpoints[1].Conditions.Ready = &f
	before = m.Tracker.Seq()
	if _, err := c.DiscoveryV1().EndpointSlices("demo").Update(ctx, flip, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ch := waitDrain(t, m.Tracker, before)
	if len(ch.Endpoints) != 1 || ch.Endpoints[0] != web || len(ch.Services) != 0 {
		t.Fatalf("changes %+v, want only %s's endpoints", ch, web)
	}
	st, _ := m.Tracker.Drain()
	if st.Endpoints[web][1].Ready {
		t.Error("the flipped endpoint is still ready")
	}

	// A Service change: affinity on.
	svc, err := c.CoreV1().Services("demo").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc = svc.DeepCopy()
	svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	before = m.Tracker.Seq()
	if _, err := c.CoreV1().Services("demo").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ch = waitDrain(t, m.Tracker, before)
	if len(ch.Services) != 1 || ch.Services[0] != web {
		t.Fatalf("changes %+v, want %s's settings", ch, web)
	}
	if sp := st.Services[web]; !sp.ClientIPAffinity || sp.AffinityTimeout != 10800 {
		t.Errorf("affinity not applied: %+v", sp)
	}

	// Deleting the slice removes the endpoints.
	before = m.Tracker.Seq()
	if err := c.DiscoveryV1().EndpointSlices("demo").Delete(ctx, "web-x7k2p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ch = waitDrain(t, m.Tracker, before)
	if len(ch.Endpoints) != 1 || len(st.Endpoints[web]) != 0 {
		t.Errorf("after delete: changes %+v, endpoints %v", ch, st.Endpoints[web])
	}
}

// TestMergeSlicesPrefersReady follows kube-proxy: an endpoint listed in two
// slices is kept once, and the ready copy wins.
func TestMergeSlicesPrefersReady(t *testing.T) {
	tr := cluster.NewTracker()
	name, port, proto := "http", int32(80), corev1.ProtocolTCP
	mk := func(n string, ready bool) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: n, Namespace: "ns", Labels: map[string]string{discoveryv1.LabelServiceName: "s"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		}
	}
	tr.OnEndpointSlice("ns", "a", mk("a", false), "s")
	tr.OnEndpointSlice("ns", "b", mk("b", true), "s")
	st, ch := tr.Drain()
	spn := cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "s"}, Port: "http", Protocol: proto}
	if eps := st.Endpoints[spn]; len(eps) != 1 || !eps[0].Ready {
		t.Fatalf("endpoints %+v", eps)
	}
	if len(ch.Endpoints) != 1 {
		t.Errorf("changes %+v", ch)
	}
	if _, ch := tr.Drain(); !ch.Empty() {
		t.Errorf("a drain without events reported %+v", ch)
	}
}

func TestSummaryMatchesGenerator(t *testing.T) {
	m := open(t, "../../scenarios/1000-services.yaml")
	s := Summarize(m.Expanded, m.State)
	g := m.Expanded.Generated
	if s.Services != 1000 || s.ServicePorts != g.ServicePorts || s.Endpoints.Total != g.Endpoints ||
		s.Policies.ClientIPAffinity != g.SessionAffinity || s.Policies.InternalTrafficPolicyLocal != g.InternalTrafficPolicyLocal ||
		s.Policies.ExternalTrafficPolicyLocal != g.ExternalTrafficPolicyLocal || s.EndpointSlices != g.EndpointSlices ||
		s.Endpoints.NotReady != g.NotReadyEndpoints || s.Endpoints.ServingTerminating != g.TerminatingEndpoints {
		t.Errorf("summary %+v does not match generator counts %+v", s, g)
	}
	if len(s.Nodes) != 24 {
		t.Errorf("nodes %d", len(s.Nodes))
	}
}

// BenchmarkLoad1000 and BenchmarkLoad30000 measure the whole path: parse,
// validate, expand, load into the fake clientset, informer sync, tracker.
func BenchmarkLoad1000(b *testing.B)  { benchLoad(b, "../../scenarios/1000-services.yaml") }
func BenchmarkLoad30000(b *testing.B) { benchLoad(b, "../../scenarios/30000-services.yaml") }

func benchLoad(b *testing.B, file string) {
	for i := 0; i < b.N; i++ {
		m, err := Open(context.Background(), file, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(len(m.State.Services)), "serviceports")
		m.Close()
	}
}

var _ = scenario.APIVersion
