package apiserver

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kpsim/kpsim/sim/scenario"
)

func expand(t testing.TB, file string) (*scenario.Loaded, *scenario.Expanded) {
	t.Helper()
	l, err := scenario.LoadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	exp, err := scenario.Expand(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	return l, exp
}

// connected brings a scenario up the way a harness does over a real API
// server: the expanded objects written through the clientset by Seed (not
// loaded into the fake's tracker), then Connect, Start and AddTrackerSynced,
// the calls harness/conform makes before it starts a dataplane.Syncer on the
// tracker.
func connected(t testing.TB, file string) *Model {
	t.Helper()
	l, exp := expand(t, file)
	client := fake.NewSimpleClientset()
	if _, err := Seed(context.Background(), client, exp, SeedOptions{}); err != nil {
		t.Fatal(err)
	}
	return connect(t, l, exp, client)
}

func connect(t testing.TB, l *scenario.Loaded, exp *scenario.Expanded, client kubernetes.Interface) *Model {
	t.Helper()
	c, err := Connect(client)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), SyncTimeout); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	tr, err := c.AddTrackerSynced(context.Background(), SyncTimeout)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := tr.Drain()
	return &Model{Loaded: l, Expanded: exp, Cluster: c, Tracker: tr, State: st}
}

var addrCmp = cmp.Options{cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })}

// recorder records every EndpointSlice create and update the clientset
// receives, for the trigger-time check.
type recorder struct {
	mu     sync.Mutex
	writes []*discoveryv1.EndpointSlice
}

func (r *recorder) react(a k8stesting.Action) (bool, runtime.Object, error) {
	if o, ok := a.(interface{ GetObject() runtime.Object }); ok && (a.GetVerb() == "create" || a.GetVerb() == "update") {
		r.mu.Lock()
		r.writes = append(r.writes, o.GetObject().(*discoveryv1.EndpointSlice).DeepCopy())
		r.mu.Unlock()
	}
	return false, nil, nil
}

// stamped checks that every slice write since from carried a trigger time
// no earlier than since, and returns the count of writes seen.
func (r *recorder) stamped(t *testing.T, from int, since time.Time) int {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.writes[from:] {
		v, ok := s.Annotations[corev1.EndpointsLastChangeTriggerTime]
		at, err := time.Parse(time.RFC3339Nano, v)
		if !ok || err != nil || at.Before(since.Add(-time.Microsecond)) {
			t.Errorf("EndpointSlice %s/%s written with trigger time %q (want one at or after %s)", s.Namespace, s.Name, v, since.Format(time.RFC3339Nano))
		}
	}
	return len(r.writes) - from
}

// TestSeedConnectMatchesLoad seeds a scenario through the clientset and
// requires the tracker behind Connect to hold the same state as the one
// behind Load, with the node addresses Seed was given.
func TestSeedConnectMatchesLoad(t *testing.T) {
	file := "../../scenarios/conformance/terminating.yaml"
	l, exp := expand(t, file)
	// A Pod object, as a scenario's objects may hold: Seed must skip it.
	exp.Pods = append(exp.Pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "p"}})
	client := fake.NewSimpleClientset()
	rec := &recorder{}
	client.PrependReactor("*", "endpointslices", rec.react)
	addrs := map[string]netip.Addr{}
	for i, n := range exp.Nodes {
		addrs[n.Name] = netip.AddrFrom4([4]byte{10, 250, 0, byte(10 + i)})
	}
	start := time.Now()
	n, err := Seed(context.Background(), client, exp, SeedOptions{NodeAddrs: addrs, Concurrency: 3})
	if err != nil {
		t.Fatal(err)
	}
	if want := len(exp.Nodes) + len(exp.Services) + len(exp.Slices); n != want {
		t.Errorf("Seed made %d writes, want %d (nodes, services, slices)", n, want)
	}
	if got := rec.stamped(t, 0, start); got != len(exp.Slices) {
		t.Errorf("%d slice writes, want %d", got, len(exp.Slices))
	}
	pods, err := client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	if err != nil || len(pods.Items) != 0 {
		t.Errorf("pods written: %v %v", pods, err)
	}
	for _, ns := range namespaces(exp.Services, exp.Slices) {
		if _, err := client.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{}); err != nil {
			t.Errorf("namespace %s not created: %v", ns, err)
		}
	}
	got := connect(t, l, exp, client).State
	want := open(t, file).State
	if d := cmp.Diff(want.Services, got.Services, addrCmp); d != "" {
		t.Errorf("services differ (-load +connect):\n%s", d)
	}
	if d := cmp.Diff(want.Endpoints, got.Endpoints, addrCmp); d != "" {
		t.Errorf("endpoints differ (-load +connect):\n%s", d)
	}
	for name, node := range got.Nodes {
		if node.IP != addrs[name] || node.PodCIDR != want.Nodes[name].PodCIDR {
			t.Errorf("node %s: IP %s pod CIDR %s, want %s and %s", name, node.IP, node.PodCIDR, addrs[name], want.Nodes[name].PodCIDR)
		}
	}
	if len(got.Nodes) != len(exp.Nodes) {
		t.Errorf("%d nodes, want %d", len(got.Nodes), len(exp.Nodes))
	}

	// Seeding again over the same API updates in place: Nodes and Services
	// are unchanged (no write), every slice is rewritten with a new stamp.
	again := time.Now()
	n, err = Seed(context.Background(), client, exp, SeedOptions{NodeAddrs: addrs})
	if err != nil {
		t.Fatal(err)
	}
	if n != len(exp.Slices) {
		t.Errorf("a second Seed made %d writes, want %d (the slices only)", n, len(exp.Slices))
	}
	rec.stamped(t, len(exp.Slices), again)
}

// TestSeedNodeStatus moves a Node's address through the status subresource
// when the Node exists already, and sets the pod CIDR given.
func TestSeedNodeStatus(t *testing.T) {
	_, exp := expand(t, "../../scenarios/conformance/distribution.yaml")
	client := fake.NewSimpleClientset()
	var status []string
	client.PrependReactor("update", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		status = append(status, a.GetSubresource())
		return false, nil, nil
	})
	if _, err := Seed(context.Background(), client, exp, SeedOptions{}); err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr("10.250.0.9")
	p := netip.MustParsePrefix("10.244.9.0/24")
	o := SeedOptions{NodeAddrs: map[string]netip.Addr{"node-a": a}, PodCIDRs: map[string]netip.Prefix{"node-b": p}}
	if _, err := Seed(context.Background(), client, exp, o); err != nil {
		t.Fatal(err)
	}
	// node-a: its labels and spec are as they were (no update), its address
	// moves (status); node-b: the pod CIDR moves (an update of the Node).
	if d := cmp.Diff([]string{"status", ""}, status); d != "" {
		t.Errorf("node updates (subresource; -want +got):\n%s", d)
	}
	na, _ := client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	nb, _ := client.CoreV1().Nodes().Get(context.Background(), "node-b", metav1.GetOptions{})
	if len(na.Status.Addresses) != 1 || na.Status.Addresses[0].Address != a.String() || nb.Spec.PodCIDR != p.String() {
		t.Errorf("node-a addresses %v, node-b pod CIDR %q", na.Status.Addresses, nb.Spec.PodCIDR)
	}
}

// TestUpsertDeleteRoundTrip creates, updates and deletes a Service and its
// slice through Upsert and DeleteObjects, with a tracker behind Connect
// seeing each write.
func TestUpsertDeleteRoundTrip(t *testing.T) {
	client := fake.NewSimpleClientset()
	rec := &recorder{}
	client.PrependReactor("*", "endpointslices", rec.react)
	m := connect(t, nil, nil, client)
	ctx := context.Background()
	svc, sl := testService("d-1", "s", "10.96.5.5"), testSlice("d-1", "s", "s-a", "10.244.0.5")
	start := time.Now()
	upsertWait(t, m, 2, []*corev1.Service{svc}, []*discoveryv1.EndpointSlice{sl})
	name := spn("d-1", "s", "http")
	st, _ := m.Tracker.Drain()
	if got := conds(st.Endpoints[name]); len(got) != 1 || got[0] != "10.244.0.5:RS-" || st.Services[name] == nil {
		t.Fatalf("after create: service %+v endpoints %v", st.Services[name], got)
	}
	if _, ok := sl.Annotations[corev1.EndpointsLastChangeTriggerTime]; ok {
		t.Error("Upsert stamped the caller's slice")
	}

	svc2 := svc.DeepCopy()
	svc2.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	sl2 := testSlice("d-1", "s", "s-a", "10.244.0.5", "10.244.1.6")
	upsertWait(t, m, 2, []*corev1.Service{svc2}, []*discoveryv1.EndpointSlice{sl2})
	st, _ = m.Tracker.Drain()
	if sp := st.Services[name]; !sp.ClientIPAffinity || len(st.Endpoints[name]) != 2 {
		t.Errorf("after update: %+v %v", sp, conds(st.Endpoints[name]))
	}
	// The same Service again is no write; the slice is always written.
	upsertWait(t, m, 1, []*corev1.Service{svc2}, []*discoveryv1.EndpointSlice{sl2})
	// Three slice writes: a create, then twice a create refused (the slice
	// exists) followed by an update; every attempt carries the stamp.
	if got := rec.stamped(t, 0, start); got != 5 {
		t.Errorf("%d slice write attempts, want 5", got)
	}

	before := m.Tracker.Seq()
	keys := []types.NamespacedName{{Namespace: "d-1", Name: "s"}}
	slKeys := []types.NamespacedName{{Namespace: "d-1", Name: "s-a"}}
	n, err := DeleteObjects(ctx, client, keys, slKeys)
	if err != nil || n != 2 {
		t.Fatalf("DeleteObjects: %d, %v; want 2 deletions", n, err)
	}
	waitSeq(t, m.Tracker, before+2)
	if st, _ := m.Tracker.Drain(); len(st.Services) != 0 || len(st.Endpoints[name]) != 0 {
		t.Errorf("after delete: %+v %v", st.Services, st.Endpoints)
	}
	if n, err := DeleteObjects(ctx, client, keys, slKeys); err != nil || n != 0 {
		t.Errorf("deleting what is gone: %d, %v; want 0, nil", n, err)
	}
}

func upsertWait(t *testing.T, m *Model, want int, svcs []*corev1.Service, sl []*discoveryv1.EndpointSlice) {
	t.Helper()
	before := m.Tracker.Seq()
	n, err := Upsert(context.Background(), m.Cluster.Client, svcs, sl)
	if err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Fatalf("Upsert made %d writes, want %d", n, want)
	}
	waitSeq(t, m.Tracker, before+uint64(n))
}

func testService(ns, name, ip string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
}

func testSlice(ns, svc, name string, addrs ...string) *discoveryv1.EndpointSlice {
	pn, port, proto, t := "http", int32(8080), corev1.ProtocolTCP, true
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "kpsim.dev"}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: &pn, Port: &port, Protocol: &proto}}}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: &t, Serving: &t}})
	}
	return s
}

// TestMergeServiceKeepsAPIFields: an update from a caller's Service that
// leaves allocated and defaulted fields empty keeps the API's values, and
// equals the API's copy when nothing else changed.
func TestMergeServiceKeepsAPIFields(t *testing.T) {
	want := testService("ns", "s", "")
	want.Spec.ClusterIPs = nil
	want.Spec.Type = corev1.ServiceTypeNodePort
	want.Spec.Ports[0].Protocol = ""
	cur := want.DeepCopy()
	cur.ResourceVersion = "7"
	single, cl, timeout := corev1.IPFamilyPolicySingleStack, corev1.ServiceInternalTrafficPolicyCluster, int32(10800)
	cur.Spec.ClusterIP, cur.Spec.ClusterIPs = "10.96.0.20", []string{"10.96.0.20"}
	cur.Spec.IPFamilies, cur.Spec.IPFamilyPolicy = []corev1.IPFamily{corev1.IPv4Protocol}, &single
	cur.Spec.SessionAffinity, cur.Spec.InternalTrafficPolicy = corev1.ServiceAffinityNone, &cl
	cur.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	cur.Spec.Ports[0].Protocol, cur.Spec.Ports[0].NodePort = corev1.ProtocolTCP, 30080
	if d := cmp.Diff(cur, mergeService(cur, want)); d != "" {
		t.Errorf("merge of an unchanged Service (-api +merged):\n%s", d)
	}
	want.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	cur.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
	m := mergeService(cur, want)
	if m.Spec.SessionAffinity != corev1.ServiceAffinityClientIP || m.ResourceVersion != "7" || m.Spec.Ports[0].NodePort != 30080 {
		t.Errorf("merged %+v", m)
	}
	if got := forAPI(testService("ns", "c", "10.96.0.3")); got.Spec.ExternalTrafficPolicy != "" {
		t.Errorf("forAPI kept externalTrafficPolicy %q on a ClusterIP Service", got.Spec.ExternalTrafficPolicy)
	}
}

// conflictOnce makes the first update of a resource fail with a Conflict,
// as a real API does when the object changed since it was read.
func conflictOnce(client *fake.Clientset, resource string) *int {
	calls := 0
	client.PrependReactor("update", resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		calls++
		if calls == 1 {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: resource}, "x", nil)
		}
		return false, nil, nil
	})
	return &calls
}

// TestConflictRetried: an update that meets a Conflict is made again from
// a fresh read, for every writer: Apply's endpoint and service steps and
// Upsert's update path.
func TestConflictRetried(t *testing.T) {
	m := connected(t, "../../scenarios/conformance/distribution.yaml")
	client := m.Cluster.Client.(*fake.Clientset)
	calls := conflictOnce(client, "endpointslices")
	st, _ := applyDrain(t, m, Step{Action: ActSetReady, Service: "demo/web", Pod: "web-1", Ready: false})
	if *calls != 2 {
		t.Errorf("%d slice update attempts, want 2 (a conflict, then the write)", *calls)
	}
	if got := conds(st.Endpoints[spn("demo", "web", "http")]); got[1] != "10.244.0.11:---" {
		t.Errorf("after the retried step: %v", got)
	}
	svcCalls := conflictOnce(client, "services")
	timeout := int32(60)
	st, _ = applyDrain(t, m, Step{Action: ActServiceUpdate, Service: "demo/web", Update: &scenario.Event{SessionAffinity: "ClientIP", AffinityTimeout: &timeout}})
	if sp := st.Services[spn("demo", "web", "http")]; *svcCalls != 2 || !sp.ClientIPAffinity || sp.AffinityTimeout != 60 {
		t.Errorf("service update after a conflict: %d attempts, %+v", *svcCalls, sp)
	}
	svc, _ := client.CoreV1().Services("demo").Get(context.Background(), "web", metav1.GetOptions{})
	svc.Spec.SessionAffinity = corev1.ServiceAffinityNone
	svc.Spec.SessionAffinityConfig = nil
	*svcCalls = 0
	upsertWait(t, m, 1, []*corev1.Service{svc}, nil)
	if *svcCalls != 2 {
		t.Errorf("Upsert: %d service update attempts, want 2", *svcCalls)
	}
}

// TestScaleBeyondSliceThenDelete scales past one slice's capacity (a new
// slice is created), then Delete removes every slice of the Service, the
// created one included, and the namespaces when asked.
func TestScaleBeyondSliceThenDelete(t *testing.T) {
	m := connected(t, "../../scenarios/conformance/distribution.yaml")
	web := spn("demo", "web", "http")
	st, _ := applyDrain(t, m, Step{Action: ActScale, Service: "demo/web", Replicas: scenario.MaxEndpointsPerSlice + 20})
	if got := len(st.Endpoints[web]); got != scenario.MaxEndpointsPerSlice+20 {
		t.Fatalf("scaled to %d endpoints", got)
	}
	if sl := m.Cluster.SlicesOf("demo", "web"); len(sl) != 2 {
		t.Fatalf("%d slices after scaling past %d", len(sl), scenario.MaxEndpointsPerSlice)
	}
	seen := map[string]bool{}
	for _, e := range st.Endpoints[web] {
		if seen[e.IP.String()] {
			t.Errorf("address %s handed out twice", e.IP)
		}
		seen[e.IP.String()] = true
	}
	client := m.Cluster.Client
	n, err := Delete(context.Background(), client, m.Expanded, DeleteOptions{Namespaces: true})
	if want := len(m.Expanded.Services) + len(m.Expanded.Slices) + 1; err != nil || n != want {
		t.Fatalf("Delete: %d, %v; want %d deletions", n, err, want)
	}
	left, _ := client.DiscoveryV1().EndpointSlices("").List(context.Background(), metav1.ListOptions{})
	svcs, _ := client.CoreV1().Services("").List(context.Background(), metav1.ListOptions{})
	if len(left.Items) != 0 || len(svcs.Items) != 0 {
		t.Errorf("left after Delete: %d slices, %d services", len(left.Items), len(svcs.Items))
	}
	if _, err := client.CoreV1().Namespaces().Get(context.Background(), "demo", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("namespace demo: %v, want not found", err)
	}
}

// TestSeedErrors: an API refusal names the object, says why when the
// cluster IP is default/kubernetes's, and a namespace being deleted is
// refused before anything is written into it.
func TestSeedErrors(t *testing.T) {
	client := fake.NewSimpleClientset(testService("default", "kubernetes", "10.96.0.1"))
	client.PrependReactor("create", "services", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*corev1.Service)
		if s.Spec.ClusterIP == "10.96.0.1" {
			return true, nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Service"}, s.Name, nil)
		}
		return false, nil, nil
	})
	_, err := Upsert(context.Background(), client, []*corev1.Service{testService("demo", "first", "10.96.0.1")}, nil)
	if err == nil || !strings.Contains(err.Error(), "Service demo/first") || !strings.Contains(err.Error(), "default/kubernetes") || !apierrors.IsInvalid(err) {
		t.Errorf("error %v: want one naming demo/first and default/kubernetes, wrapping the API's", err)
	}
	// The same refusal for a Service that exists (kube-apiserver allocates
	// the IP before it looks for the name) is an update.
	if _, err := client.CoreV1().Services("default").Get(context.Background(), "kubernetes", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	own := testService("default", "kubernetes", "10.96.0.1")
	own.Labels = map[string]string{"component": "apiserver"}
	if n, err := Upsert(context.Background(), client, []*corev1.Service{own}, nil); err != nil || n != 1 {
		t.Errorf("Upsert of an existing Service refused as Invalid: %d, %v; want 1 update", n, err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gone"}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceTerminating}}
	if _, err := client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Upsert(context.Background(), client, nil, []*discoveryv1.EndpointSlice{testSlice("gone", "s", "s-a", "10.0.0.1")}); err == nil || !strings.Contains(err.Error(), "namespace gone") {
		t.Errorf("error %v: want the namespace being deleted named", err)
	}
}

// TestSeedRealClusterExport seeds what `kubectl get -o yaml` printed for a
// real cluster (resourceVersion, uid, creationTimestamp, managedFields and
// owner references on every object) into a fake that refuses a create
// carrying them, as kube-apiserver does ("resourceVersion should not be set
// on objects to be created").
func TestSeedRealClusterExport(t *testing.T) {
	for _, file := range []string{"../../scenarios/testdata/import/kind.yaml", "../../scenarios/testdata/import/kubeadm.yaml"} {
		_, exp := expand(t, file)
		server := 0
		for _, s := range exp.Slices {
			if s.ResourceVersion != "" || s.UID != "" || len(s.OwnerReferences) > 0 {
				server++
			}
		}
		if server == 0 {
			t.Fatalf("%s: no slice carries server-set metadata: the test would pass by construction", file)
		}
		client := fake.NewSimpleClientset()
		client.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
			m, err := apimeta.Accessor(a.(k8stesting.CreateAction).GetObject())
			if err != nil {
				return true, nil, err
			}
			if m.GetResourceVersion() != "" || m.GetUID() != "" || !m.GetCreationTimestamp().Time.IsZero() || len(m.GetManagedFields()) > 0 || len(m.GetOwnerReferences()) > 0 {
				return true, nil, apierrors.NewBadRequest("resourceVersion should not be set on objects to be created")
			}
			return false, nil, nil
		})
		n, err := Seed(context.Background(), client, exp, SeedOptions{})
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if want := len(exp.Nodes) + len(exp.Services) + len(exp.Slices); n < want {
			t.Errorf("%s: %d writes, want at least %d", file, n, want)
		}
	}
}
