package conform

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/agent"
	"github.com/kpsim/kpsim/harness/remote"
	"github.com/kpsim/kpsim/harness/traffic"
	"github.com/kpsim/kpsim/sim/apiserver"
)

// agentAPI is what the cluster machine asks of the agent pods: the
// agents' HTTP API through the kube-apiserver's pods/proxy (podProxyAgents),
// or a fake in tests.
type agentAPI interface {
	send(ctx context.Context, a remote.Agent, req agent.SendRequest) (agent.SendResult, error)
	counts(ctx context.Context, a remote.Agent, tag uint32) (agent.Counts, error)
}

// clusterMachine runs a suite's checks on a cluster reached through its
// API (sim conform --kubeconfig): the probes leave from prober pods, the
// echo pods count them, and the cluster's own node proxy decides. The
// checks keep the scenario's addresses: the machine translates at its
// edge, a probe's destination to the Service's allocated cluster IP, and an
// arrival's endpoint and client back to the scenario's (Placement).
//
// What it cannot do, it says: no rule counters (the node proxy is not
// ours to read), so a lost probe's cause is unknown; no conntrack flush,
// so a probe's independence rests on its tuple being fresh (no UDP tuple
// is reused within udpReuse; a TCP tuple's entry closes with the reset
// the prober's kernel sends on the echo's answer, and a SYN on a closed
// entry is a new connection); and a timeline step is programmed after a
// fixed settle time, as nothing tells when a node proxy has synced.
type clusterMachine struct {
	s      *suite
	api    agentAPI
	client kubernetes.Interface
	plan   *remote.Plan
	pl     *remote.Placement
	cls    []*netns.Client
	start  time.Time
	settle time.Duration

	// vip maps the scenario's service addresses to the cluster's; back
	// maps the cluster's addresses (echo pods, prober pods, nodes) to the
	// scenario's.
	vip  map[netip.AddrPort]netip.AddrPort
	back map[netip.Addr]netip.Addr

	mu         sync.Mutex
	tag        uint32
	used       map[string]remote.Agent // probers of the phase, by cluster node
	sent       int
	sendErrors int
	dropBase   map[netip.Addr]uint64
	// lastUse is when each source port last carried a UDP probe, per
	// prober node and destination.
	lastUse map[portKey][]time.Time
	// sentTotal and sendTime measure the probers' rate.
	sentTotal int
	sendTime  time.Duration
}

type portKey struct {
	node string
	vip  netip.AddrPort
}

// udpReuse is how long a UDP probe's tuple stays out of use: the
// conntrack entry of a datagram lives 30 s (nf_conntrack_udp_timeout, and
// replied flows younger than 2 s too), and a datagram on a live entry
// would follow its old decision.
const udpReuse = 35 * time.Second

// Waits of collect: agents are read over the API server, so the quiet
// period is longer than the kernel machine's.
var (
	clusterQuiet      = timeScaled(time.Second)
	clusterCollectMax = timeScaled(20 * time.Second)
)

func newClusterMachine(s *suite, api agentAPI, client kubernetes.Interface, plan *remote.Plan, pl *remote.Placement, cls []*netns.Client, nodeIPs map[string]netip.Addr, settle time.Duration) (*clusterMachine, error) {
	m := &clusterMachine{s: s, api: api, client: client, plan: plan, pl: pl, start: time.Now(), settle: settle,
		vip: map[netip.AddrPort]netip.AddrPort{}, back: map[netip.Addr]netip.Addr{}, dropBase: map[netip.Addr]uint64{},
		lastUse: map[portKey][]time.Time{}, used: map[string]remote.Agent{}}
	st := s.state()
	for _, spn := range st.SortedServicePorts() {
		sp := st.Services[spn]
		if !sp.ClusterIP.IsValid() {
			continue
		}
		svc := pl.Services[types.NamespacedName{Namespace: spn.Namespace, Name: spn.Name}]
		if svc == nil {
			return nil, fmt.Errorf("service %s/%s was not created on the cluster", spn.Namespace, spn.Name)
		}
		ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil {
			return nil, fmt.Errorf("service %s/%s: the cluster's cluster IP %q: %w", svc.Namespace, svc.Name, svc.Spec.ClusterIP, err)
		}
		m.vip[netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port))] = netip.AddrPortFrom(ip, uint16(sp.Port))
	}
	for model, real := range pl.Endpoint {
		m.back[real] = model
	}
	for _, c := range cls {
		node := plan.Node(c.Node)
		p, ok := pl.Probers[node]
		if !ok {
			continue
		}
		if _, seen := m.back[p.IP]; !seen {
			m.back[p.IP] = c.Config.Addrs[0]
		}
		m.cls = append(m.cls, c)
	}
	for name, n := range st.Nodes {
		if ip, ok := nodeIPs[plan.Node(name)]; ok && n.IP.IsValid() {
			m.back[ip] = n.IP
		}
	}
	if len(m.cls) == 0 {
		return nil, fmt.Errorf("no client pod of the scenario stands on a node with a prober")
	}
	return m, nil
}

func (m *clusterMachine) clients() []*netns.Client { return m.cls }
func (m *clusterMachine) now() time.Duration       { return time.Since(m.start) }

// flush cannot empty a cluster node's conntrack table; fresh tuples take
// its place (send).
func (m *clusterMachine) flush() {}

// counters: the cluster's node proxy is not ours to read.
func (m *clusterMachine) counters(string) []dataplane.Counter { return nil }

func (m *clusterMachine) idle(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// quiesce: late probes of an earlier phase carry its tag, which no later
// phase counts.
func (m *clusterMachine) quiesce() {}

// phase moves to the next tag (1 to agent.MaxTag, round) and forgets the
// phase's figures.
func (m *clusterMachine) phase() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tag = m.tag%agent.MaxTag + 1
	m.used = map[string]remote.Agent{}
	m.sent, m.sendErrors = 0, 0
	m.dropBase = nil
}

// send writes a batch from the prober on the client's node: the kernel
// prober's blocks and port walks, each block one request; with a Gap, one
// probe a request, Gap apart (bounded: the batch's count times Gap). A UDP block
// whose ports carried a probe to the same destination less than udpReuse
// ago waits until they are free (bounded by udpReuse).
func (m *clusterMachine) send(ctx context.Context, b Probe, r *rand.Rand) (int, error) {
	if b.N > maxProbesPerPhase {
		return 0, fmt.Errorf("%d probes exceed the bound of %d per phase", b.N, maxProbesPerPhase)
	}
	node := m.plan.Node(b.Client.Node)
	prober, ok := m.pl.Probers[node]
	if !ok {
		return 0, fmt.Errorf("no prober pod on node %s (scenario node %s)", node, b.Client.Node)
	}
	dst, ok := m.vip[b.VIP]
	if !ok {
		return 0, fmt.Errorf("%s is no cluster IP of the scenario's Services on the cluster", b.VIP)
	}
	if m.dropBase == nil {
		if err := m.readDropBase(ctx); err != nil {
			return 0, err
		}
	}
	m.mu.Lock()
	m.used[node] = prober
	tag := m.tag
	m.mu.Unlock()
	proto := "tcp"
	if b.Proto == traffic.UDP {
		proto = "udp"
	}
	total := 0
	blocks := planBlocks(b.N, r)
	if b.Gap > 0 {
		var one []block
		for _, bl := range blocks {
			one = append(one, bl.probes()...)
		}
		blocks = one
	}
	for i, bl := range blocks {
		if i > 0 && b.Gap > 0 {
			if err := m.idle(ctx, b.Gap); err != nil {
				return total, err
			}
		}
		if b.Proto == traffic.UDP {
			if err := m.waitPorts(ctx, portKey{node, dst}, bl); err != nil {
				return total, err
			}
		}
		t0 := time.Now()
		res, err := m.api.send(ctx, prober, agent.SendRequest{Tag: tag, Proto: proto, VIP: dst.String(), First: uint32(bl.First), N: bl.N, Start: bl.Start, Step: bl.Step})
		d := time.Since(t0)
		m.mu.Lock()
		m.sent += res.Sent
		m.sendErrors += res.SendErrors
		m.sentTotal += res.Sent
		m.sendTime += d
		m.mu.Unlock()
		total += res.Sent
		if err != nil {
			return total, &EnvironmentError{fmt.Errorf("prober %s/%s on %s: %w", prober.Namespace, prober.Name, node, err)}
		}
		if res.Error != "" {
			return total, &EnvironmentError{fmt.Errorf("prober %s/%s on %s: %s", prober.Namespace, prober.Name, node, res.Error)}
		}
	}
	return total, nil
}

// waitPorts waits until no port of the block carried a UDP probe to the
// destination within udpReuse, then marks them used now.
func (m *clusterMachine) waitPorts(ctx context.Context, k portKey, bl block) error {
	m.mu.Lock()
	use := m.lastUse[k]
	if use == nil {
		use = make([]time.Time, traffic.PortSpan)
		m.lastUse[k] = use
	}
	var latest time.Time
	for j := 0; j < bl.N; j++ {
		if t := use[int(bl.port(j))-traffic.PortLo]; t.After(latest) {
			latest = t
		}
	}
	m.mu.Unlock()
	if wait := time.Until(latest.Add(udpReuse)); wait > 0 {
		if err := m.idle(ctx, wait); err != nil {
			return err
		}
	}
	now := time.Now()
	m.mu.Lock()
	for j := 0; j < bl.N; j++ {
		use[int(bl.port(j))-traffic.PortLo] = now
	}
	m.mu.Unlock()
	return nil
}

// readDropBase reads every agent's cumulative socket drops at the phase's
// first send.
func (m *clusterMachine) readDropBase(ctx context.Context) error {
	base := map[netip.Addr]uint64{}
	for _, a := range m.pl.Echoes {
		c, err := m.api.counts(ctx, a, 0)
		if err != nil {
			return &EnvironmentError{fmt.Errorf("echo pod %s/%s: %w", a.Namespace, a.Name, err)}
		}
		base[a.IP] = c.ObserverDrops
	}
	for _, a := range m.pl.Probers {
		c, err := m.api.counts(ctx, a, 0)
		if err != nil {
			return &EnvironmentError{fmt.Errorf("prober %s/%s: %w", a.Namespace, a.Name, err)}
		}
		base[a.IP] = c.ObserverDrops
	}
	m.mu.Lock()
	m.dropBase = base
	m.mu.Unlock()
	return nil
}

// collect reads the agents' counts of the phase's tag until expected
// probes are accounted for, or nothing new came for clusterQuiet, at most
// clusterCollectMax. An agent that cannot be read makes the phase's
// observation incomplete: its drops are set so that the loss accounting
// calls the phase an environment error.
func (m *clusterMachine) collect(expected int) Counts {
	ctx := context.Background()
	deadline := time.Now().Add(clusterCollectMax)
	last, lastChange := -1, time.Now()
	var c Counts
	for {
		c = m.read(ctx)
		if c.Seen >= expected || time.Now().After(deadline) {
			break
		}
		if c.Seen != last {
			last, lastChange = c.Seen, time.Now()
		} else if time.Since(lastChange) > clusterQuiet {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return c
}

func (m *clusterMachine) read(ctx context.Context) Counts {
	m.mu.Lock()
	tag, probers := m.tag, make(map[string]remote.Agent, len(m.used))
	for k, v := range m.used {
		probers[k] = v
	}
	c := Counts{Arrivals: map[Key]int{}, Rejects: map[netip.Addr]int{}, Sent: m.sent, SendErrors: m.sendErrors}
	base := m.dropBase
	m.mu.Unlock()
	drops := func(a remote.Agent, cur uint64) {
		if b, ok := base[a.IP]; ok && cur > b {
			c.ObserverDrops += cur - b
		}
	}
	for _, a := range m.pl.Echoes {
		got, err := m.api.counts(ctx, a, tag)
		if err != nil || got.Evicted {
			c.ObserverDrops += uint64(max(1, c.Sent)) // unreadable: the observation is incomplete
			continue
		}
		drops(a, got.ObserverDrops)
		for _, ar := range got.Arrivals {
			ep, err1 := netip.ParseAddrPort(ar.Endpoint)
			cl, err2 := netip.ParseAddr(ar.Client)
			if err1 != nil || err2 != nil {
				continue
			}
			k := Key{Endpoint: netip.AddrPortFrom(m.backOf(ep.Addr()), ep.Port()), Client: m.backOf(cl)}
			c.Arrivals[k] += ar.N
			c.Seen += ar.N
		}
	}
	for _, a := range probers {
		got, err := m.api.counts(ctx, a, tag)
		if err != nil || got.Evicted {
			c.ObserverDrops += uint64(max(1, c.Sent))
			continue
		}
		drops(a, got.ObserverDrops)
		if got.Rejects > 0 {
			c.Rejects[m.backOf(a.IP)] += got.Rejects
		}
		c.OtherICMP += got.OtherICMP
		c.Seen += got.Rejects + got.OtherICMP
	}
	return c
}

// backOf is the scenario's address for a cluster address (itself when the
// cluster's is none the run placed).
func (m *clusterMachine) backOf(a netip.Addr) netip.Addr {
	if b, ok := m.back[a]; ok {
		return b
	}
	return a
}

// apply writes the step into the model (the oracle's state), mirrors the
// Service's EndpointSlices (or its spec) to the cluster, and waits the
// settle time: nothing on a cluster says when its node proxies have
// programmed a change.
func (m *clusterMachine) apply(ctx context.Context, step apiserver.Step) (map[string]time.Duration, error) {
	if err := m.s.applyModel(ctx, step); err != nil {
		return nil, err
	}
	ns, name, _ := strings.Cut(step.Service, "/")
	svc := types.NamespacedName{Namespace: ns, Name: name}
	if step.Action == apiserver.ActServiceUpdate {
		if err := m.mirrorService(ctx, svc); err != nil {
			return nil, &applyError{err}
		}
	} else {
		model, err := m.s.m.Cluster.Client.DiscoveryV1().EndpointSlices(svc.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
		if err != nil {
			return nil, &applyError{fmt.Errorf("the model's slices of %s: %w", svc, err)}
		}
		var sl []*discoveryv1.EndpointSlice
		for i := range model.Items {
			sl = append(sl, &model.Items[i])
		}
		if _, err := m.pl.Mirror(ctx, m.client, m.plan, svc, sl); err != nil {
			return nil, &applyError{err}
		}
	}
	if err := m.idle(ctx, m.settle); err != nil {
		return nil, err
	}
	out := map[string]time.Duration{}
	for _, c := range m.cls {
		out[c.Node] = m.settle
	}
	return out, nil
}

// mirrorService writes the model's spec of a Service (what a step
// changes: session affinity, traffic policies) over the cluster's,
// keeping what the cluster allocated.
func (m *clusterMachine) mirrorService(ctx context.Context, svc types.NamespacedName) error {
	want, err := m.s.m.Cluster.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the model's Service %s: %w", svc, err)
	}
	ns := m.plan.Namespace(svc.Namespace)
	api := m.client.CoreV1().Services(ns)
	cur, err := api.Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("service %s/%s: %w", ns, svc.Name, err)
	}
	cur.Spec.SessionAffinity, cur.Spec.SessionAffinityConfig = want.Spec.SessionAffinity, want.Spec.SessionAffinityConfig
	cur.Spec.InternalTrafficPolicy, cur.Spec.ExternalTrafficPolicy = want.Spec.InternalTrafficPolicy, want.Spec.ExternalTrafficPolicy
	if cur.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
		cur.Spec.HealthCheckNodePort = 0
	}
	if _, err := api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("could not update Service %s/%s: %w", ns, svc.Name, err)
	}
	return nil
}

// rate is the probes the probers sent and the time their sends took.
func (m *clusterMachine) rate() (int, time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sentTotal, m.sendTime
}
