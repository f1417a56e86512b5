package conform

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kpsim/kpsim/harness/agent"
	"github.com/kpsim/kpsim/harness/remote"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/sim/cluster"
)

// fakeCluster is a cluster on a fake clientset: two Ready nodes, a
// kubelet that runs the run's pods (and the prober DaemonSet's), cluster
// IPs allocated on create, and a node proxy that sends every probe to a
// ready endpoint of its Service's EndpointSlices as they are at the send
// (uniformly at random, or always the first one: pick).
type fakeCluster struct {
	c    *fake.Clientset
	mu   sync.Mutex
	rng  *rand.Rand
	pick func(r *rand.Rand, n int) int
	// counts per agent address and tag
	arrivals map[netip.Addr]map[uint32]map[agent.Arrival]int
	rejects  map[netip.Addr]map[uint32]int
	nextIP   int
	// icmpLimit, when set, is the nodes' ICMP rate limit as the kernel
	// applies it per destination (inet_peer_xrlim_allow): a budget of six
	// errors, one more each icmpLimit; a probe that finds none is dropped
	// silently.
	icmpLimit time.Duration
	tokens    map[netip.Addr]float64
	lastICMP  map[netip.Addr]time.Time
	// requests are the send requests, in order.
	requests []agent.SendRequest
}

// icmpAllowed spends one of a's ICMP budget (always true without a limit).
func (f *fakeCluster) icmpAllowed(a netip.Addr) bool {
	if f.icmpLimit <= 0 {
		return true
	}
	now := time.Now()
	tok, ok := f.tokens[a]
	if !ok {
		tok = 6
	} else {
		tok = min(6, tok+float64(now.Sub(f.lastICMP[a]))/float64(f.icmpLimit))
	}
	f.lastICMP[a] = now
	if tok < 1 {
		f.tokens[a] = tok
		return false
	}
	f.tokens[a] = tok - 1
	return true
}

func newFakeCluster(t *testing.T, ctx context.Context, nodes []string, pick func(*rand.Rand, int) int) *fakeCluster {
	f := &fakeCluster{c: fake.NewClientset(), rng: rand.New(rand.NewPCG(1, 2)), pick: pick,
		arrivals: map[netip.Addr]map[uint32]map[agent.Arrival]int{}, rejects: map[netip.Addr]map[uint32]int{},
		tokens: map[netip.Addr]float64{}, lastICMP: map[netip.Addr]time.Time{}}
	for i, n := range nodes {
		_, err := f.c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
				Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("192.168.0.%d", i+1)}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	svcs := 0
	f.c.PrependReactor("create", "services", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*corev1.Service)
		if s.Spec.ClusterIP == "" {
			svcs++
			s.Spec.ClusterIP = fmt.Sprintf("10.100.0.%d", svcs)
		}
		return false, nil, nil
	})
	go func() {
		for ctx.Err() == nil {
			f.kubelet(ctx)
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return f
}

func (f *fakeCluster) kubelet(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	nss, _ := f.c.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	for _, n := range nss.Items {
		_, _ = f.c.CoreV1().ServiceAccounts(n.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: n.Name}}, metav1.CreateOptions{})
	}
	pods, _ := f.c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	have := map[string]bool{}
	for i := range pods.Items {
		p := &pods.Items[i]
		have[p.Namespace+"/"+p.Spec.NodeName+"/"+p.Labels[remote.LabelRole]] = true
		if p.Status.Phase == corev1.PodRunning {
			continue
		}
		f.nextIP++
		p.Status.Phase, p.Status.PodIP = corev1.PodRunning, fmt.Sprintf("10.9.%d.%d", f.nextIP/250, f.nextIP%250+1)
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		_, _ = f.c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	}
	ds, _ := f.c.AppsV1().DaemonSets("").List(ctx, metav1.ListOptions{})
	for _, d := range ds.Items {
		for _, term := range d.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, node := range term.MatchFields[0].Values[:1] {
				if have[d.Namespace+"/"+node+"/prober"] {
					continue
				}
				p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: d.Name + "-" + node, Namespace: d.Namespace, Labels: d.Spec.Template.Labels},
					Spec: *d.Spec.Template.Spec.DeepCopy()}
				p.Spec.NodeName = node
				_, _ = f.c.CoreV1().Pods(d.Namespace).Create(ctx, p, metav1.CreateOptions{})
			}
		}
	}
}

// endpoints are the ready endpoints of the Service at vip, as the slices
// are now.
func (f *fakeCluster) endpoints(ctx context.Context, vip netip.AddrPort) ([]netip.AddrPort, error) {
	svcs, err := f.c.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, s := range svcs.Items {
		if s.Spec.ClusterIP != vip.Addr().String() {
			continue
		}
		sl, err := f.c.DiscoveryV1().EndpointSlices(s.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + s.Name})
		if err != nil {
			return nil, err
		}
		var out []netip.AddrPort
		for _, x := range sl.Items {
			for _, ep := range x.Endpoints {
				if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
					continue
				}
				out = append(out, netip.AddrPortFrom(netip.MustParseAddr(ep.Addresses[0]), uint16(*x.Ports[0].Port)))
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("no service at %s", vip)
}

func (f *fakeCluster) send(ctx context.Context, a remote.Agent, req agent.SendRequest) (agent.SendResult, error) {
	vip, err := netip.ParseAddrPort(req.VIP)
	if err != nil {
		return agent.SendResult{}, err
	}
	eps, err := f.endpoints(ctx, vip)
	if err != nil {
		return agent.SendResult{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, req)
	for range req.N {
		if len(eps) == 0 {
			if !f.icmpAllowed(a.IP) {
				continue
			}
			if f.rejects[a.IP] == nil {
				f.rejects[a.IP] = map[uint32]int{}
			}
			f.rejects[a.IP][req.Tag]++
			continue
		}
		ep := eps[f.pick(f.rng, len(eps))]
		m := f.arrivals[ep.Addr()]
		if m == nil {
			m = map[uint32]map[agent.Arrival]int{}
			f.arrivals[ep.Addr()] = m
		}
		if m[req.Tag] == nil {
			m[req.Tag] = map[agent.Arrival]int{}
		}
		m[req.Tag][agent.Arrival{Endpoint: ep.String(), Client: a.IP.String()}]++
	}
	return agent.SendResult{Sent: req.N}, nil
}

func (f *fakeCluster) counts(_ context.Context, a remote.Agent, tag uint32) (agent.Counts, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := agent.Counts{Tag: tag, Rejects: f.rejects[a.IP][tag]}
	for k, n := range f.arrivals[a.IP][tag] {
		k.N = n
		c.Arrivals = append(c.Arrivals, k)
	}
	return c, nil
}

func runFakeRemote(t *testing.T, pick func(*rand.Rand, int) int, files ...string) (*report.Run, *fakeCluster) {
	t.Helper()
	return runFakeRemoteLimited(t, pick, 0, 0, files...)
}

// runFakeRemoteLimited is runFakeRemote on nodes with an ICMP rate limit
// (icmpLimit, zero: none) and rejects paced at rejectGap.
func runFakeRemoteLimited(t *testing.T, pick func(*rand.Rand, int) int, icmpLimit, rejectGap time.Duration, files ...string) (*report.Run, *fakeCluster) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFakeCluster(t, ctx, []string{"worker-1", "worker-2"}, pick)
	f.icmpLimit = icmpLimit
	seed := uint64(7)
	o := Options{Mode: cluster.ModeIPTables, Seed: &seed}
	ro := RemoteOptions{Client: f.c, Settle: time.Millisecond, Ready: 10 * time.Second, agents: f, RejectInterval: rejectGap}
	run, err := RunRemote(ctx, files, o, ro)
	if err != nil {
		t.Fatal(err)
	}
	return run, f
}

// TestRemoteRun runs the flapping and no-endpoints scenarios through the
// cluster machine on a fake cluster whose proxy is correct: the timeline
// is mirrored to the cluster's slices, arrivals and rejects are
// translated back to the scenario's addresses, and every verdict passes;
// the run's namespaces are gone afterwards.
func TestRemoteRun(t *testing.T) {
	run, f := runFakeRemote(t, func(r *rand.Rand, n int) int { return r.IntN(n) },
		"../../scenarios/conformance/flapping.yaml", "../../scenarios/conformance/no-endpoints.yaml")
	ran, _ := run.Verdicts()
	if ran < 5 || len(run.Failed()) > 0 || len(run.EnvironmentErrors()) > 0 {
		t.Errorf("ran %d, failed %v, environment %v", ran, run.Failed(), run.EnvironmentErrors())
	}
	for _, s := range run.Suites {
		if s.SetupError != "" {
			t.Errorf("%s: %s", s.Scenario, s.SetupError)
		}
		if m, ok := s.Figures["nodes"].(map[string]string); !ok || m["node-a"] != "worker-1" {
			t.Errorf("%s: node map %v", s.Scenario, s.Figures["nodes"])
		}
	}
	if ns, _ := f.c.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{}); len(ns.Items) != 0 {
		t.Errorf("%d namespaces left", len(ns.Items))
	}
	if run.Subject != SubjectCluster {
		t.Errorf("subject %q", run.Subject)
	}
}

// TestRemoteRunCatchesAProxyFault: the same with a proxy that always picks
// the first ready endpoint fails the flapping scenario's checks.
func TestRemoteRunCatchesAProxyFault(t *testing.T) {
	run, _ := runFakeRemote(t, func(*rand.Rand, int) int { return 0 }, "../../scenarios/conformance/flapping.yaml")
	if failed := run.Failed(); len(failed) == 0 || !strings.Contains(strings.Join(failed, " "), "flapping") {
		t.Errorf("a proxy that always picks one endpoint passed: failed %v", failed)
	}
}

// TestRemoteRejectsPaced: on nodes that keep an ICMP rate limit (scaled:
// six errors, then one each 20 ms), a no-endpoints check whose probes go
// out at full speed loses most rejects and fails; paced one per 21 ms it
// passes with PacedRejectProbes probes, each its own request on its own
// source port.
func TestRemoteRejectsPaced(t *testing.T) {
	const limit = 20 * time.Millisecond
	file := "../../scenarios/conformance/no-endpoints.yaml"
	uniform := func(r *rand.Rand, n int) int { return r.IntN(n) }
	run, _ := runFakeRemoteLimited(t, uniform, limit, 0, file)
	if failed := run.Failed(); len(failed) != 2 {
		t.Errorf("unpaced under the limit: failed %v, want both no-endpoints checks", failed)
	}
	run, f := runFakeRemoteLimited(t, uniform, limit, limit+limit/20, file)
	ran, _ := run.Verdicts()
	if ran != 2 || len(run.Failed()) > 0 || len(run.EnvironmentErrors()) > 0 {
		t.Fatalf("paced: ran %d, failed %v, environment %v", ran, run.Failed(), run.EnvironmentErrors())
	}
	for _, c := range run.Suites[0].Checks {
		if c.N != PacedRejectProbes {
			t.Errorf("%s: %d probes, want %d", c.Name, c.N, PacedRejectProbes)
		}
	}
	ports := map[string]map[int]bool{}
	for _, r := range f.requests {
		if r.N != 1 {
			t.Errorf("a paced request carries %d probes", r.N)
		}
		k := fmt.Sprint(r.Tag, r.VIP)
		if ports[k] == nil {
			ports[k] = map[int]bool{}
		}
		if ports[k][r.Start] {
			t.Errorf("%s: source port %d twice", k, r.Start)
		}
		ports[k][r.Start] = true
	}
	if len(f.requests) != 2*PacedRejectProbes {
		t.Errorf("%d requests, want %d", len(f.requests), 2*PacedRejectProbes)
	}
}
