package apiserver

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/harness/upstream"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// realServiceCIDR is the scenarios' service range, given to kube-apiserver.
var realServiceCIDR = netip.MustParsePrefix("10.96.0.0/16")

// startRealAPI starts etcd and kube-apiserver in the control-plane
// namespace of a run of its own (two node namespaces, unused here: the
// topology builder wants nodes) and returns the admin client, once the
// API server has written its own EndpointSlice (upstream.StartForTest), so
// that no write of the API server's lands among the tracker events the
// test counts.
func startRealAPI(t *testing.T, ctx context.Context) kubernetes.Interface {
	t.Helper()
	_, cp := upstream.StartForTest(t, ctx, upstream.TestControlPlane{Topology: netns.Config{
		ServiceCIDR: realServiceCIDR, ControlPlane: netip.MustParsePrefix("198.18.255.254/16"),
		Nodes: []netns.NodeConfig{
			{Name: "node-a", Addr: netip.MustParsePrefix("198.18.0.1/16"), PodCIDR: netip.MustParsePrefix("10.244.0.0/24"), Gateway: netip.MustParseAddr("10.244.0.1")},
			{Name: "node-b", Addr: netip.MustParsePrefix("198.18.0.2/16"), PodCIDR: netip.MustParsePrefix("10.244.1.0/24"), Gateway: netip.MustParseAddr("10.244.1.1")},
		},
	}})
	return cp.Client()
}

// TestRealAPIServer writes scenarios into a real kube-apiserver with the
// one writer (Seed, every timeline step through Cluster.Apply, Delete
// between scenarios on the same API) and requires a tracker behind Connect
// to go through exactly the states a tracker goes through over the fake
// clientset (Open), step by step: the API's validation accepts every write,
// and its defaulting changes nothing a proxy reads. default/kubernetes, the
// API server's own Service, is the one object the fake lacks.
func TestRealAPIServer(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.SkipIfShort(t, "starts etcd and kube-apiserver in a namespace")
	ctx := t.Context()
	client := startRealAPI(t, ctx)
	timeout := int32(5)
	extra := []Step{ // every action the timelines of these files lack
		{Action: ActScale, Service: "demo/web", Replicas: scenario.MaxEndpointsPerSlice + 20},
		{Action: ActScale, Service: "demo/web", Replicas: 1},
		{Action: ActServiceUpdate, Service: "demo/web", Update: &scenario.Event{SessionAffinity: "ClientIP", AffinityTimeout: &timeout, InternalTrafficPolicy: "Local"}},
		{Action: ActServiceUpdate, Service: "demo/web", Update: &scenario.Event{SessionAffinity: "None"}},
		{Action: ActSetReady, Service: "demo/api", Endpoint: "10.244.1.21", Ready: false},
		{Action: ActTerminate, Service: "demo/api", Count: 2},
		{Action: ActRemove, Service: "demo/api", Count: 1},
	}
	for _, c := range []struct {
		file  string
		steps []Step
	}{
		{"distribution.yaml", extra},
		{"flapping.yaml", nil},
		{"terminating.yaml", nil},
	} {
		t.Run(c.file, func(t *testing.T) {
			file := "../../scenarios/conformance/" + c.file
			want := open(t, file)
			steps := append(Timeline(want.Loaded.Scenario), c.steps...)
			if len(steps) == 0 {
				t.Fatal("no step to apply")
			}
			got := seedReal(t, ctx, client, file)
			compareStates(t, "after Seed", want.State, got.State)
			for _, s := range steps {
				wantSt, _ := applyDrain(t, want, s)
				gotSt, _ := applyDrain(t, got, s)
				compareStates(t, s.String(), wantSt, gotSt)
			}
			n, err := Delete(ctx, client, got.Expanded, DeleteOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if n < len(got.Expanded.Services)+len(got.Expanded.Slices) {
				t.Errorf("Delete made %d deletions, want at least %d", n, len(got.Expanded.Services)+len(got.Expanded.Slices))
			}
		})
	}
	t.Run("upsert", func(t *testing.T) { testRealUpsert(t, client) })
}

// testRealUpsert: Upsert's writes are accepted and its write count is the
// real API's count of events. An Upsert of what the API holds already is
// no Service write: the fields the API allocated and defaulted
// (clusterIPs, ipFamilies, internalTrafficPolicy, the affinity timeout)
// are carried over from its copy; if one were missed, the count would
// exceed the events the API sends and the wait for them would fail.
func testRealUpsert(t *testing.T, client kubernetes.Interface) {
	m := connect(t, nil, nil, client)
	svc := testService("b-upsert", "s", "10.96.7.7")
	svc.Spec.ClusterIPs, svc.Spec.Type = nil, ""
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster // refused by the API on a ClusterIP Service: cleared
	sl := testSlice("b-upsert", "s", "s-a", "10.244.0.5", "10.244.1.5")
	upsertWait(t, m, 2, []*corev1.Service{svc}, []*discoveryv1.EndpointSlice{sl})
	upsertWait(t, m, 1, []*corev1.Service{svc}, []*discoveryv1.EndpointSlice{sl})
	aff := svc.DeepCopy()
	aff.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	upsertWait(t, m, 1, []*corev1.Service{aff}, nil)
	upsertWait(t, m, 0, []*corev1.Service{aff}, nil)
	name := spn("b-upsert", "s", "http")
	st, _ := m.Tracker.Drain()
	if sp := st.Services[name]; sp == nil || !sp.ClientIPAffinity || sp.AffinityTimeout != 10800 || sp.ClusterIP.String() != "10.96.7.7" || len(st.Endpoints[name]) != 2 {
		t.Fatalf("after the upserts: %+v %v", sp, conds(st.Endpoints[name]))
	}
	before := m.Tracker.Seq()
	n, err := DeleteObjects(t.Context(), client, []types.NamespacedName{{Namespace: "b-upsert", Name: "s"}}, []types.NamespacedName{{Namespace: "b-upsert", Name: "s-a"}})
	if err != nil || n != 2 {
		t.Fatalf("DeleteObjects: %d, %v; want 2", n, err)
	}
	waitSeq(t, m.Tracker, before+2)
	if st, _ := m.Tracker.Drain(); st.Services[name] != nil || len(st.Endpoints[name]) != 0 {
		t.Errorf("after DeleteObjects: %+v %v", st.Services[name], st.Endpoints[name])
	}
}

// seedReal seeds a scenario into the real API and connects a tracker.
func seedReal(t *testing.T, ctx context.Context, client kubernetes.Interface, file string) *Model {
	t.Helper()
	l, exp := expand(t, file)
	start := time.Now()
	n, err := Seed(ctx, client, exp, SeedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Seed: %d writes in %s", n, time.Since(start).Round(time.Millisecond))
	return connect(t, l, exp, client)
}

// compareStates requires the real API's state to equal the fake's, but for
// the API server's own default/kubernetes.
func compareStates(t *testing.T, when string, want, got *cluster.State) {
	t.Helper()
	services := map[cluster.ServicePortName]*cluster.ServicePort{}
	for k, v := range got.Services {
		if k.Namespace != "default" || k.Name != "kubernetes" {
			services[k] = v
		}
	}
	endpoints := map[cluster.ServicePortName][]*cluster.Endpoint{}
	for k, v := range got.Endpoints {
		if k.Namespace != "default" || k.Name != "kubernetes" {
			endpoints[k] = v
		}
	}
	if d := cmp.Diff(want.Services, services, addrCmp); d != "" {
		t.Errorf("%s: services differ (-fake +real):\n%s", when, d)
	}
	if d := cmp.Diff(want.Endpoints, endpoints, addrCmp); d != "" {
		t.Errorf("%s: endpoints differ (-fake +real):\n%s", when, d)
	}
	if d := cmp.Diff(want.Nodes, got.Nodes, addrCmp); d != "" {
		t.Errorf("%s: nodes differ (-fake +real):\n%s", when, d)
	}
}
