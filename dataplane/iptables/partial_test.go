package iptables

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpsim/kpsim/sim/cluster"
)

// TestPartialSync: a partial render after some changes leaves the fake in
// the same state as a full render of the new state on a fresh fake, writes
// only the changed service ports' chains and deletes the stale ones.
func TestPartialSync(t *testing.T) {
	for _, mode := range []AffinityMode{AffinityRecent, AffinityIPSet} {
		t.Run(string(mode), func(t *testing.T) {
			cfg := testConfig()
			cfg.Affinity = mode
			st := overallState()
			f, b, full := load(t, cfg, st)

			n2, n3, n7 := name("ns2", "svc2", "p80"), name("ns3", "svc3", "p80"), name("ns7", "svc7", "p80")
			n10 := name("ns10", "svc10", "p80")
			// svc2 loses an endpoint, svc7 is deleted, svc10 is new, svc3
			// (affinity) changes its timeout.
			removed := st.Endpoints[n2][0]
			st.Endpoints[n2] = st.Endpoints[n2][1:]
			delete(st.Services, n7)
			delete(st.Endpoints, n7)
			add(st, clusterIPPort(n10, "172.30.0.50", 80), ep("10.180.0.20", 80, otherNode, "R"))
			sp3 := *st.Services[n3]
			sp3.AffinityTimeout = 60
			st.Services[n3] = &sp3
			changed := []cluster.ServicePortName{n2, n3, n7, n10}
			rs := apply(t, b, st, changed, false)
			if rs.Full {
				t.Fatal("render after a commit with full=false is full")
			}
			if mode == AffinityRecent {
				golden(t, "partial-restore", rs.Restore)
			} else {
				golden(t, "partial-ipset", rs.IPSetRestore+"---\n"+rs.IPSetDestroy)
			}

			fresh, _, want := load(t, cfg, st)
			if d := lineDiff(fresh.Dump(), f.Dump()); d != "" {
				t.Errorf("partial sync differs from a full one (-full +partial):\n%s", d)
			}
			if d := lineDiff(fresh.DumpIPSets(), f.DumpIPSets()); d != "" {
				t.Errorf("sets differ (-full +partial):\n%s", d)
			}
			if rs.NATRules != want.NATRules || rs.NATChains != want.NATChains || rs.FilterRules != want.FilterRules {
				t.Errorf("partial counts nat %d/%d filter %d, full %d/%d %d",
					rs.NATRules, rs.NATChains, rs.FilterRules, want.NATRules, want.NATChains, want.FilterRules)
			}
			if rs.Lines >= full.Lines {
				t.Errorf("partial sync wrote %d lines, the full one %d", rs.Lines, full.Lines)
			}
			sep := EndpointChain(n2, removed.String())
			for _, c := range []string{sep, ServiceChain(n7)} {
				if !slices.Contains(rs.Stale, c) {
					t.Errorf("stale chains %v miss %s", rs.Stale, c)
				}
				if !strings.Contains(rs.Restore, "-X "+c+"\n") {
					t.Errorf("no -X %s", c)
				}
			}
			// Unchanged service ports are not written.
			if strings.Contains(rs.Restore, ":"+ServiceChain(name("ns1", "svc1", "p80"))) {
				t.Error("partial sync rewrote an unchanged service port")
			}
			// Nothing left to delete on the next sync.
			rs = apply(t, b, st, nil, false)
			if len(rs.Stale) != 0 || len(rs.StaleSets) != 0 {
				t.Errorf("stale again: %v %v", rs.Stale, rs.StaleSets)
			}
		})
	}
}

// TestPartialSyncMissedChange: a partial render trusts the changes it is
// given: a change it is not told about stays unapplied (the removed endpoint
// still gets traffic) until a full render, which repairs it.
func TestPartialSyncMissedChange(t *testing.T) {
	st := overallState()
	f, b, _ := load(t, testConfig(), st)
	n2 := name("ns2", "svc2", "p80")
	removed := st.Endpoints[n2][0].String()
	st.Endpoints[n2] = st.Endpoints[n2][1:]
	apply(t, b, st, nil, false)
	if p := tracePacket(t, f, podIP, "172.30.0.42", 80, nil).P(removed); p == 0 {
		t.Error("a partial render applied a change it was not told about")
	}
	rs := apply(t, b, st, nil, true)
	if !slices.Contains(rs.Stale, EndpointChain(n2, removed)) {
		t.Errorf("full render does not delete %s: %v", EndpointChain(n2, removed), rs.Stale)
	}
	fresh, _, _ := load(t, testConfig(), st)
	if d := lineDiff(fresh.Dump(), f.Dump()); d != "" {
		t.Errorf("full sync after a missed change differs:\n%s", d)
	}
}

// TestRestoreFailureLeavesTables: a restore that iptables-restore refuses
// (here an endpoint chain deleted while an unchanged service chain still
// jumps to it) changes nothing. Through the Backend: a partial sync that
// would delete an endpoint chain fails in nat (filter committed), and the
// full sync after it deletes the chain and leaves the tables exactly as a
// fresh full sync does.
func TestRestoreFailureLeavesTables(t *testing.T) {
	st := overallState()
	b, c := newBackend(t, testConfig())
	f := c.Fake
	apply(t, b, st, nil, true)
	before := f.Dump()
	n2 := name("ns2", "svc2", "p80")
	sep := EndpointChain(n2, st.Endpoints[n2][0].String())
	bad := "*nat\n:" + sep + " - [0:0]\n-X " + sep + "\nCOMMIT\n"
	if err := f.Restore(bad); !errors.Is(err, ErrChainInUse) {
		t.Fatalf("restore error = %v, want ErrChainInUse", err)
	}
	if f.Dump() != before {
		t.Error("a failed restore changed the tables")
	}

	st.Endpoints[n2] = st.Endpoints[n2][1:]
	c.Fail(CommandRestore, FakeFailure{Table: "nat"})
	if _, err := b.Sync(st, []cluster.ServicePortName{n2}, false); !errors.Is(err, ErrInjected) {
		t.Fatalf("sync error = %v, want the injected failure", err)
	}
	if !slices.Contains(f.ChainNames("nat"), sep) {
		t.Fatalf("%s left nat although its commit failed", sep)
	}
	rs := apply(t, b, st, nil, true)
	if !slices.Contains(rs.Stale, sep) {
		t.Errorf("stale %v lacks %s", rs.Stale, sep)
	}
	fresh, _, _ := load(t, testConfig(), st)
	if d := lineDiff(fresh.Dump(), f.Dump()); d != "" {
		t.Errorf("sync after a failure differs from a fresh one (-fresh +got):\n%s", d)
	}
}

// TestFirstRenderIsFull: without a commit, a partial render is full.
func TestFirstRenderIsFull(t *testing.T) {
	r := mustRenderer(t, testConfig())
	rs, err := r.Render(overallState(), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if !rs.Full || !strings.Contains(rs.Restore, ":"+ServiceChain(name("ns1", "svc1", "p80"))) {
		t.Error("first render is not full")
	}
	r.Commit(rs)
	r.Reset()
	if rs, _ = r.Render(overallState(), nil, false); !rs.Full {
		t.Error("render after Reset is not full")
	}
}

// TestLargeClusterStaleChains: in large-cluster mode kube-proxy deletes
// stale chains at most once per syncPeriod; until then they stay in the
// kernel with their rules, and a service port that comes back takes its
// chains over. Out of large-cluster mode they go at once.
func TestLargeClusterStaleChains(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := testConfig()
	cfg.LargeClusterThreshold = 2
	cfg.Now = func() time.Time { return now }
	st := newState()
	a, z := name("ns", "a", "p"), name("ns", "z", "p")
	add(st, clusterIPPort(a, "172.30.0.80", 80), ep("10.180.0.1", 80, otherNode, "R"), ep("10.180.0.2", 80, otherNode, "R"))
	add(st, clusterIPPort(z, "172.30.0.81", 80), ep("10.180.0.3", 80, otherNode, "R"))
	f, b, _ := load(t, cfg, st)
	svcZ, sepZ := ServiceChain(z), EndpointChain(z, "10.180.0.3:80")
	hasChain := func(c string) bool { return slices.Contains(f.ChainNames("nat"), c) }

	// z goes 10 s after the first (cleaning) sync: its chains stay, rules
	// and all, though KUBE-SERVICES no longer jumps to them.
	now = now.Add(10 * time.Second)
	delete(st.Services, z)
	delete(st.Endpoints, z)
	add(st, clusterIPPort(a, "172.30.0.80", 80), ep("10.180.0.1", 80, otherNode, "R"), ep("10.180.0.2", 80, otherNode, "R"), ep("10.180.0.4", 80, otherNode, "R"))
	rs := apply(t, b, st, []cluster.ServicePortName{a, z}, false)
	if len(rs.Stale) != 0 || !slices.Equal(rs.Lingering, []string{sepZ, svcZ}) {
		t.Fatalf("stale %v, lingering %v; want none deleted and %v left", rs.Stale, rs.Lingering, []string{sepZ, svcZ})
	}
	if d := f.Dump(); !hasChain(svcZ) || !strings.Contains(d, "-A "+sepZ+" ") || !strings.Contains(d, "-A "+svcZ+" ") || strings.Contains(d, "-j "+svcZ) {
		t.Errorf("z's chains were not left as they were:\n%s", f.Dump())
	}
	// 31 s after the cleaning sync, the next sync deletes them.
	now = now.Add(21 * time.Second)
	rs = apply(t, b, st, nil, false)
	if !slices.Equal(rs.Stale, []string{sepZ, svcZ}) || hasChain(svcZ) || hasChain(sepZ) {
		t.Errorf("after the period: stale %v, nat chains %v", rs.Stale, f.ChainNames("nat"))
	}

	// A service port that comes back while its chains linger takes them
	// over, and nothing of it is deleted later.
	delete(st.Services, a)
	delete(st.Endpoints, a)
	add(st, clusterIPPort(z, "172.30.0.81", 80), ep("10.180.0.3", 80, otherNode, "R"), ep("10.180.0.5", 80, otherNode, "R"), ep("10.180.0.6", 80, otherNode, "R"))
	now = now.Add(time.Second)
	rs = apply(t, b, st, []cluster.ServicePortName{a, z}, false)
	if len(rs.Stale) != 0 || len(rs.Lingering) != 4 {
		t.Fatalf("a deleted: stale %v, lingering %v", rs.Stale, rs.Lingering)
	}
	add(st, clusterIPPort(a, "172.30.0.80", 80), ep("10.180.0.1", 80, otherNode, "R"))
	rs = apply(t, b, st, []cluster.ServicePortName{a}, false)
	if want := []string{EndpointChain(a, "10.180.0.2:80"), EndpointChain(a, "10.180.0.4:80")}; !slices.Equal(sorted(rs.Lingering), sorted(want)) {
		t.Errorf("a back with one endpoint: lingering %v, want %v", rs.Lingering, want)
	}
	now = now.Add(time.Minute)
	rs = apply(t, b, st, nil, false)
	if len(rs.Lingering) != 0 {
		t.Errorf("after the period: lingering %v, want none", rs.Lingering)
	}
	fresh, _, _ := load(t, cfg, st)
	if d := lineDiff(fresh.Dump(), f.Dump()); d != "" {
		t.Errorf("after the period, the rules differ from a fresh full sync (-fresh +kept):\n%s", d)
	}

	// Below the threshold, stale chains go at once.
	delete(st.Services, z)
	delete(st.Endpoints, z)
	now = now.Add(time.Second)
	if rs = apply(t, b, st, []cluster.ServicePortName{z}, false); len(rs.Lingering) != 0 || len(rs.Stale) != 4 {
		t.Errorf("small cluster: stale %v, lingering %v", rs.Stale, rs.Lingering)
	}
}

func sorted(l []string) []string { return slices.Sorted(slices.Values(l)) }
