package ipvs

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

func webState(eps ...*cluster.Endpoint) (*cluster.State, Key) {
	st := newState()
	add(st, clusterIPPort(name("ns", "web", "http"), "172.30.0.10", 80), eps...)
	return st, key("TCP", "172.30.0.10:80")
}

func three() []*cluster.Endpoint {
	return []*cluster.Endpoint{ep("10.180.0.1", 8080, thisNode, "R"), ep("10.180.0.2", 8080, otherNode, "R"), ep("10.180.0.3", 8080, otherNode, "R")}
}

// schedule sends n connections through the fake's scheduler and returns the
// endpoints in order.
func schedule(t *testing.T, f *Fake, k Key, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i := range out {
		a, err := f.Schedule(k, 60)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a.String()
	}
	return out
}

func counts(seq []string) map[string]int {
	m := map[string]int{}
	for _, s := range seq {
		m[s]++
	}
	return m
}

func TestSyncProgramsKernelState(t *testing.T) {
	f := newFakes(t, testConfig())
	st, k := webState(three()...)
	res := f.sync(t, st, true)
	if !res.Full || res.Lines == 0 || res.Bytes == 0 {
		t.Errorf("result %+v", res)
	}
	addrs, err := f.sys.Addresses(DummyDevice)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(addrs, []netip.Addr{k.Addr}) {
		t.Errorf("kube-ipvs0 holds %v, want %v", addrs, k.Addr)
	}
	want := map[string]string{
		"net/ipv4/vs/conntrack": "1", "net/ipv4/vs/expire_nodest_conn": "1", "net/ipv4/vs/expire_quiescent_template": "1",
		"net/ipv4/vs/conn_reuse_mode": "1", // kernel 6.1 >= 5.9: left as it is
		"net/ipv4/ip_forward":         "1",
	}
	if d := cmp.Diff(want, f.sys.Sysctls()); d != "" {
		t.Errorf("sysctls (-want +got):\n%s", d)
	}
	// rr: strict rotation.
	seq := schedule(t, f.ipvs, k, 9)
	for i := 3; i < len(seq); i++ {
		if seq[i] != seq[i-3] {
			t.Fatalf("rr is not a strict rotation: %v", seq)
		}
	}
	if len(counts(seq[:3])) != 3 {
		t.Fatalf("rr missed an endpoint: %v", seq)
	}
}

// TestConnReuseModeOldKernel: kube-proxy sets conn_reuse_mode=0 on kernels
// 4.1 to 5.8 only.
func TestConnReuseModeOldKernel(t *testing.T) {
	for rel, want := range map[string]string{"5.4.0-150-generic": "0", "5.9.0": "1", "4.0.9": "1", "6.1.0-57-amd64": "1"} {
		f := newFakes(t, testConfig())
		f.sys.Release = rel
		st, _ := webState(three()...)
		f.sync(t, st, true)
		if got := f.sys.Sysctls()["net/ipv4/vs/conn_reuse_mode"]; got != want {
			t.Errorf("kernel %s: conn_reuse_mode %s, want %s", rel, got, want)
		}
	}
}

// TestGracefulTermination follows kube-proxy's GracefulTerminationManager:
// a TCP real server with connections goes to weight 0 and stays until they
// are gone; one coming back while draining is deleted and added afresh; a
// UDP one is deleted at once.
func TestGracefulTermination(t *testing.T) {
	f := newFakes(t, testConfig())
	eps := three()
	st, k := webState(eps...)
	f.sync(t, st, true)
	leaving := netip.MustParseAddrPort("10.180.0.3:8080")
	if err := f.ipvs.SetConnections(k, leaving, 1, 4); err != nil {
		t.Fatal(err)
	}
	// An endpoint without connections leaves at once.
	st2, _ := webState(eps[0])
	f.sync(t, st2, false)
	ds := dests(t, f.ipvs, k)
	if d := cmp.Diff(map[string]int{"10.180.0.1:8080": 1, "10.180.0.3:8080": 0}, ds); d != "" {
		t.Fatalf("real servers after removal (-want +got):\n%s", d)
	}
	if got := f.b.Terminating(); !slices.Equal(got, []string{"TCP 172.30.0.10:80/10.180.0.3:8080"}) {
		t.Fatalf("terminating %v", got)
	}
	// Weight 0 gets no new connection.
	for _, a := range schedule(t, f.ipvs, k, 5) {
		if a != "10.180.0.1:8080" {
			t.Fatalf("a new connection reached %s, which is leaving", a)
		}
	}
	// Still connections: nothing deleted.
	if n, err := f.b.Drain(); n != 0 || err != nil {
		t.Fatalf("drain with connections: %d, %v", n, err)
	}
	// Back while leaving: deleted and added again with weight 1.
	before := f.ipvs.Calls["DelDestination"]
	st3, _ := webState(eps[0], eps[2])
	f.sync(t, st3, false)
	if d := cmp.Diff(map[string]int{"10.180.0.1:8080": 1, "10.180.0.3:8080": 1}, dests(t, f.ipvs, k)); d != "" {
		t.Fatalf("after coming back (-want +got):\n%s", d)
	}
	if f.ipvs.Calls["DelDestination"] != before+1 || len(f.b.Terminating()) != 0 {
		t.Errorf("the returning real server was not moved out of the terminating list: %d deletions, %v", f.ipvs.Calls["DelDestination"]-before, f.b.Terminating())
	}
	// Leaves again, then drains.
	if err := f.ipvs.SetConnections(k, leaving, 0, 2); err != nil {
		t.Fatal(err)
	}
	f.sync(t, st2, false)
	if err := f.ipvs.SetConnections(k, leaving, 0, 0); err != nil {
		t.Fatal(err)
	}
	if n, err := f.b.Drain(); n != 1 || err != nil {
		t.Fatalf("drain: %d, %v", n, err)
	}
	if d := cmp.Diff(map[string]int{"10.180.0.1:8080": 1}, dests(t, f.ipvs, k)); d != "" {
		t.Fatalf("after draining (-want +got):\n%s", d)
	}
}

func TestUDPRealServerLeavesAtOnce(t *testing.T) {
	f := newFakes(t, testConfig())
	st := newState()
	n := name("ns", "dns", "dns")
	n.Protocol = corev1.ProtocolUDP
	add(st, clusterIPPort(n, "172.30.0.53", 53), ep("10.180.0.1", 53, thisNode, "R"), ep("10.180.0.2", 53, thisNode, "R"))
	f.sync(t, st, true)
	k := key("UDP", "172.30.0.53:53")
	if err := f.ipvs.SetConnections(k, netip.MustParseAddrPort("10.180.0.2:53"), 0, 7); err != nil {
		t.Fatal(err)
	}
	st.Endpoints[n] = st.Endpoints[n][:1]
	f.sync(t, st, false)
	if d := cmp.Diff(map[string]int{"10.180.0.1:53": 1}, dests(t, f.ipvs, k)); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

func dests(t *testing.T, f *Fake, k Key) map[string]int {
	t.Helper()
	svcs, err := f.GetServices()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs {
		if KeyOf(s) == k {
			ds, err := f.GetDestinations(s)
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]int{}
			for _, d := range ds {
				out[destKey(d).String()] = d.Weight
			}
			return out
		}
	}
	t.Fatalf("no virtual server %s", k)
	return nil
}

// TestPartialSyncMatchesFull: a chain of partial syncs leaves the same
// kernel state as one full sync of the final state on fresh fakes, and a
// partial sync touches only what changed.
func TestPartialSyncMatchesFull(t *testing.T) {
	f := newFakes(t, testConfig())
	st := overallState()
	f.sync(t, st, true)
	calls := func() int {
		n := 0
		for m, c := range f.ipvs.Calls {
			if m != "SetConfig" {
				n += c
			}
		}
		return n
	}
	before := calls()
	f.sync(t, st, false)
	if calls() != before {
		t.Errorf("a partial sync of an unchanged state made %d ipvs calls", calls()-before)
	}
	// Changes: a new endpoint, a removed Service, a new Service, affinity on.
	svc1 := name("ns1", "svc1", "p80")
	st.Endpoints[svc1] = append(st.Endpoints[svc1], ep("10.180.0.99", 80, thisNode, "R"))
	delete(st.Services, name("ns6", "svc6", "p80"))
	add(st, clusterIPPort(name("ns20", "svc20", "p80"), "172.30.0.60", 80), ep("10.180.3.1", 80, otherNode, "R"))
	st.Services[name("ns2", "svc2", "p80")].ClientIPAffinity = true
	st.Services[name("ns2", "svc2", "p80")].AffinityTimeout = 60
	before = calls()
	f.sync(t, st, false)
	// svc1 +1 dest, svc6 -1 service, svc20 +1 service +1 dest, svc2 update.
	if got := calls() - before; got != 5 {
		t.Errorf("partial sync made %d ipvs calls, want 5 (%v)", got, f.ipvs.Calls)
	}
	g := newFakes(t, testConfig())
	g.sync(t, st, true)
	if d := cmp.Diff(g.dump(t), f.dump(t)); d != "" {
		t.Errorf("partial syncs differ from a full sync (-full +partial):\n%s", d)
	}
}

// TestFullSyncRemovesStrangers: a full sync reads the kernel and removes
// virtual servers and addresses nobody planned.
func TestFullSyncRemovesStrangers(t *testing.T) {
	f := newFakes(t, testConfig())
	st, _ := webState(three()...)
	f.sync(t, st, true)
	stranger := Key{Proto: "TCP", Addr: netip.MustParseAddr("172.30.9.9"), Port: 9}
	if err := f.ipvs.NewService(f.b.service(stranger, &appliedVS{scheduler: "rr"})); err != nil {
		t.Fatal(err)
	}
	if err := f.sys.AddAddress(DummyDevice, stranger.Addr); err != nil {
		t.Fatal(err)
	}
	f.sync(t, st, false)
	if strings.Contains(f.ipvs.Dump(), "172.30.9.9") == false {
		t.Fatal("a partial sync should not see the stranger")
	}
	f.sync(t, st, true)
	if strings.Contains(f.dump(t), "172.30.9.9") {
		t.Errorf("the full sync left the stranger:\n%s", f.dump(t))
	}
}

func TestSyncFailureForcesFullSync(t *testing.T) {
	f := newFakes(t, testConfig())
	st, _ := webState(three()...)
	f.sync(t, st, true)
	f.sys.Fail["iptables-nft-restore"] = errors.New("boom")
	if _, err := f.b.Sync(st, nil, false); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("sync error %v", err)
	}
	res := f.sync(t, st, false)
	if !res.Full {
		t.Error("the sync after a failure was not full")
	}
}

func TestCleanupRemovesEverything(t *testing.T) {
	f := newFakes(t, testConfig())
	f.sync(t, overallState(), true)
	if err := f.b.Cleanup(); err != nil {
		t.Fatal(err)
	}
	svcs, err := f.ipvs.GetServices()
	if err != nil {
		t.Fatal(err)
	}
	if len(svcs) != 0 {
		t.Errorf("%d virtual servers left", len(svcs))
	}
	if _, err := f.sys.Addresses(DummyDevice); err == nil {
		t.Error("kube-ipvs0 left")
	}
	if save, err := f.sys.Run("", "iptables-nft-save"); err != nil || strings.Contains(save, "KUBE-") {
		t.Errorf("rules left (%v):\n%s", err, save)
	}
	if sets, err := f.sys.Run("", "ipset", "list", "-n"); err != nil || strings.TrimSpace(sets) != "" {
		t.Errorf("sets left (%v): %s", err, sets)
	}
	// The next sync starts afresh.
	f.sync(t, overallState(), false)
	if !strings.Contains(f.dump(t), "KUBE-IPVS-FILTER") {
		t.Error("no rules after a sync following Cleanup")
	}
}

// TestInternalTrafficLocal: kube-proxy's IPVS mode uses the local endpoints
// and falls back to the cluster's when there is none; for a service port
// only reachable through its cluster IP, the cluster set is empty (it never
// uses Cluster policy), so the virtual server has no real server.
func TestInternalTrafficLocal(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nodePort int32
		eps      []*cluster.Endpoint
		want     []string
		noLocal  int
	}{
		{"local endpoints", 0, []*cluster.Endpoint{ep("10.180.0.1", 80, thisNode, "R"), ep("10.180.0.2", 80, otherNode, "R")}, []string{"10.180.0.1:80"}, 0},
		{"none local, cluster IP only", 0, []*cluster.Endpoint{ep("10.180.0.2", 80, otherNode, "R")}, nil, 1},
		{"none local, node port", 30080, []*cluster.Endpoint{ep("10.180.0.2", 80, otherNode, "R")}, []string{"10.180.0.2:80"}, 1},
		{"local terminating only", 0, []*cluster.Endpoint{ep("10.180.0.1", 80, thisNode, "ST"), ep("10.180.0.2", 80, otherNode, "R")}, []string{"10.180.0.1:80"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewRenderer(testConfig())
			if err != nil {
				t.Fatal(err)
			}
			st := newState()
			sp := clusterIPPort(name("ns", "loc", "p"), "172.30.0.60", 80)
			sp.InternalLocal = true
			if tc.nodePort != 0 {
				sp.Type, sp.NodePort = corev1.ServiceTypeNodePort, tc.nodePort
			}
			add(st, sp, tc.eps...)
			p := r.Render(st)
			v, ok := p.Server(key("TCP", "172.30.0.60:80"))
			if !ok {
				t.Fatal("no virtual server for the cluster IP")
			}
			var got []string
			for _, d := range v.Dests {
				got = append(got, d.Addr.String())
			}
			if !slices.Equal(got, tc.want) || p.NoLocalEndpoints["internal"] != tc.noLocal {
				t.Errorf("real servers %v (want %v), no local endpoints %d (want %d)", got, tc.want, p.NoLocalEndpoints["internal"], tc.noLocal)
			}
		})
	}
}

// TestFaults shows each named fault changing what is programmed, and, for
// the weight-aware schedulers, what the fake scheduler does with it.
func TestFaults(t *testing.T) {
	base := func(f proxy.Fault) (*fakes, Key) {
		fk := newFakes(t, testConfig(f))
		st, k := webState(three()...)
		sp := st.Services[name("ns", "web", "http")]
		sp.ClientIPAffinity, sp.AffinityTimeout = true, 10
		st.Endpoints[sp.Name] = append(st.Endpoints[sp.Name], ep("10.180.0.4", 8080, otherNode, ""))
		fk.sync(t, st, true)
		return fk, k
	}
	t.Run("none", func(t *testing.T) {
		f, k := base("")
		if got := f.ipvs.Dump(); !strings.Contains(got, "rr persistent 10\n") {
			t.Errorf("%s", got)
		}
		if d := cmp.Diff(map[string]int{"10.180.0.1:8080": 1, "10.180.0.2:8080": 1, "10.180.0.3:8080": 1}, dests(t, f.ipvs, k)); d != "" {
			t.Error(d)
		}
	})
	t.Run(string(proxy.FaultUniformProbability), func(t *testing.T) {
		f, k := base(proxy.FaultUniformProbability)
		if !strings.Contains(f.ipvs.Dump(), "wrr persistent 10\n") {
			t.Errorf("rr was not turned into wrr:\n%s", f.ipvs.Dump())
		}
		c := counts(schedule(t, f.ipvs, k, 400))
		if d := cmp.Diff(map[string]int{"10.180.0.1:8080": 100, "10.180.0.2:8080": 100, "10.180.0.3:8080": 200}, c); d != "" {
			t.Errorf("wrr shares (-want +got):\n%s", d)
		}
	})
	t.Run(string(proxy.FaultKeepNotReady), func(t *testing.T) {
		f, k := base(proxy.FaultKeepNotReady)
		if _, ok := dests(t, f.ipvs, k)["10.180.0.4:8080"]; !ok {
			t.Error("the not-ready endpoint is not a real server")
		}
	})
	t.Run(string(proxy.FaultAffinityNoTimeout), func(t *testing.T) {
		f, _ := base(proxy.FaultAffinityNoTimeout)
		if !strings.Contains(f.ipvs.Dump(), "persistent 15552000") {
			t.Errorf("%s", f.ipvs.Dump())
		}
	})
	t.Run(string(proxy.FaultDropLastEndpoint), func(t *testing.T) {
		f, k := base(proxy.FaultDropLastEndpoint)
		if d := cmp.Diff(map[string]int{"10.180.0.1:8080": 1, "10.180.0.2:8080": 1}, dests(t, f.ipvs, k)); d != "" {
			t.Error(d)
		}
	})
	t.Run(string(proxy.FaultKeepDeletedEndpoint), func(t *testing.T) {
		f := newFakes(t, testConfig(proxy.FaultKeepDeletedEndpoint))
		st, k := webState(three()...)
		f.sync(t, st, true)
		st2, _ := webState(three()[:1]...)
		f.sync(t, st2, false)
		if len(dests(t, f.ipvs, k)) != 3 || len(f.b.Terminating()) != 0 {
			t.Errorf("deleted endpoints were not kept: %v", dests(t, f.ipvs, k))
		}
	})
	t.Run(string(proxy.FaultIgnoreLocalPolicy), func(t *testing.T) {
		r, err := NewRenderer(testConfig(proxy.FaultIgnoreLocalPolicy))
		if err != nil {
			t.Fatal(err)
		}
		st := newState()
		sp := clusterIPPort(name("ns", "loc", "p"), "172.30.0.60", 80)
		sp.InternalLocal = true
		add(st, sp, ep("10.180.0.1", 80, thisNode, "R"), ep("10.180.0.2", 80, otherNode, "R"))
		v, ok := r.Render(st).Server(key("TCP", "172.30.0.60:80"))
		if !ok {
			t.Fatal("no virtual server for the cluster IP")
		}
		if len(v.Dests) != 2 {
			t.Errorf("Local policy kept to the local endpoint: %v", v.Dests)
		}
	})
}

// TestLeastConnection: with held (active) connections, lc sends new ones to
// the real server with the fewest.
func TestLeastConnection(t *testing.T) {
	for _, sched := range []string{"lc", "wlc", "sed", "nq"} {
		cfg := testConfig()
		cfg.Scheduler = sched
		f := newFakes(t, cfg)
		st, k := webState(three()...)
		f.sync(t, st, true)
		for _, held := range []string{"10.180.0.1:8080", "10.180.0.3:8080"} {
			if err := f.ipvs.SetConnections(k, netip.MustParseAddrPort(held), 2, 0); err != nil {
				t.Fatalf("%s: %v", sched, err)
			}
		}
		c := counts(schedule(t, f.ipvs, k, 50))
		if c["10.180.0.2:8080"] != 50 {
			t.Errorf("%s: new connections went to %v, want all to the idle 10.180.0.2:8080", sched, c)
		}
	}
}

// fakeClock is a clock for Backend.Counters: each sleep advances it, and
// onSleep (when set) runs after the n-th sleep, as the estimator would
// while Counters waits.
type fakeClock struct {
	t       time.Time
	sleeps  int
	onSleep func(n int)
}

func (c *fakeClock) install(b *Backend) {
	c.t = time.Unix(1e9, 0)
	b.clock = clock{Now: func() time.Time { return c.t }, Sleep: func(d time.Duration) {
		c.t = c.t.Add(d)
		c.sleeps++
		if c.onSleep != nil {
			c.onSleep(c.sleeps)
		}
	}}
}

// TestCountersWaitForEstimator: while the estimator has not published the
// latest packets, Counters keeps polling; it returns as soon as they are
// published (the third poll here), with every packet counted.
func TestCountersWaitForEstimator(t *testing.T) {
	cfg := testConfig()
	cfg.StatsWait = 3 * time.Second
	f := newFakes(t, cfg)
	f.ipvs.Lag = true
	st, k := webState(three()...)
	f.sync(t, st, true)
	schedule(t, f.ipvs, k, 30)
	clk := &fakeClock{onSleep: func(n int) {
		if n == 3 {
			f.ipvs.Publish()
		}
	}}
	clk.install(f.b)
	cs, err := f.b.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if clk.sleeps != 3 {
		t.Errorf("Counters slept %d times, want 3: it should poll until the estimator publishes, then stop", clk.sleeps)
	}
	var total uint64
	for _, c := range cs {
		if c.ServicePort != name("ns", "web", "http") || c.Packets != 10 || c.Bytes != 600 {
			t.Errorf("counter %+v", c)
		}
		total += c.Packets
	}
	if len(cs) != 3 || total != 30 {
		t.Errorf("counters %+v", cs)
	}
}

// TestCountersWaitIsBounded: when the published totals never catch up (a
// deleted service), Counters gives up after StatsWait and returns what is
// published.
func TestCountersWaitIsBounded(t *testing.T) {
	cfg := testConfig()
	cfg.StatsWait = 3 * time.Second
	f := newFakes(t, cfg)
	f.ipvs.Lag = true
	st, k := webState(three()...)
	f.sync(t, st, true)
	schedule(t, f.ipvs, k, 30)
	clk := &fakeClock{}
	clk.install(f.b)
	start := clk.t
	cs, err := f.b.Counters()
	if err != nil {
		t.Fatal(err)
	}
	// The first read after the deadline returns: 31 polls of 100 ms.
	if waited := clk.t.Sub(start); clk.sleeps != 31 || waited != 3100*time.Millisecond {
		t.Errorf("Counters slept %d times (%s of the fake clock), want 31 (3.1s): StatsWait is 3s", clk.sleeps, waited)
	}
	var total uint64
	for _, c := range cs {
		total += c.Packets
	}
	if len(cs) != 3 || total != 0 {
		t.Errorf("counters %+v, want the three real servers with nothing published", cs)
	}
}

func TestParseStatsPerCPU(t *testing.T) {
	// Kernel 6.1, two CPUs.
	text := `       Total Incoming Outgoing         Incoming         Outgoing
CPU    Conns  Packets  Packets            Bytes            Bytes
  0       1F       2A        5             1F40              190
  1        1        2        0               78                0
  ~       20       2C        5             1FB8              190

     Conns/s   Pkts/s   Pkts/s          Bytes/s          Bytes/s
           0        0        0                0                0
`
	c, p, ok := ParseStatsPerCPU(text)
	if !ok || c != 32 || p != 44 {
		t.Errorf("got %d conns, %d packets, %v", c, p, ok)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{{Scheduler: "lblc"}, {IPTablesVariant: "xt"}, {NodeConfig: dataplane.NodeConfig{MasqueradeBit: 40}}, {NodeIPs: []netip.Addr{netip.MustParseAddr("::1")}}} {
		if _, err := NewRenderer(cfg); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
}

func TestFaultMappingDocumented(t *testing.T) {
	m := FaultMapping()
	if len(m) != len(proxy.AllFaults()) {
		t.Fatalf("%d lines for %d faults", len(m), len(proxy.AllFaults()))
	}
	for _, l := range m {
		if strings.HasSuffix(l, ": ") {
			t.Errorf("undocumented: %s", l)
		}
	}
}
