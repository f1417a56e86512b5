package iptables

import (
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/dataplane/trace"
	"github.com/kpsim/kpsim/sim/cluster"
)

// The faults at the detection limit: each must program exactly what its
// documentation says, in both affinity layouts.

// wideService adds a cluster-IP service port with k endpoints on another
// node and returns its endpoint keys in cascade order.
func wideService(st *cluster.State, k int) (*cluster.ServicePort, []string) {
	sp := clusterIPPort(name("ns", "wide", "p"), "172.30.0.60", 80)
	var eps []*cluster.Endpoint
	var keys []string
	for i := range k {
		e := ep(fmt.Sprintf("10.181.%d.%d", i/200, i%200+1), 80, otherNode, "R")
		eps = append(eps, e)
		keys = append(keys, e.String())
	}
	add(st, sp, eps...)
	// Cascade order is kube-proxy's: endpoints as strings (proxy.SortEndpoints).
	slices.Sort(keys)
	return sp, keys
}

// cascadeShares computes each endpoint's share from the probabilities the
// cascade prints, quantised as the kernel quantises them.
func cascadeShares(t *testing.T, restore, svcChain string, n int) []float64 {
	t.Helper()
	re := regexp.MustCompile(`--probability (\S+)`)
	rest, out := 1.0, make([]float64, 0, n)
	for _, l := range strings.Split(restore, "\n") {
		if !strings.HasPrefix(l, "-A "+svcChain+" ") || !strings.Contains(l, " -j KUBE-SEP-") {
			continue
		}
		m := re.FindStringSubmatch(l)
		if m == nil {
			out = append(out, rest)
			rest = 0
			continue
		}
		p, err := QuantizedProbability(m[1])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rest*p)
		rest *= 1 - p
	}
	if len(out) != n {
		t.Fatalf("%d cascade rules in %s, want %d", len(out), svcChain, n)
	}
	return out
}

// TestFaultSkewAtMDE: the shares the printed, quantised probabilities give
// are the fault's target shares (proxy.MDESkewShares) to 1e-8, the
// tracer sees the same, and one endpoint is left as it is.
func TestFaultSkewAtMDE(t *testing.T) {
	for _, k := range []int{2, 3, 10, 20, 50} {
		st := newState()
		sp, keys := wideService(st, k)
		f, _, rs := load(t, testConfig(proxy.FaultSkewAtMDE), st)
		want := proxy.MDESkewShares(k)
		got := cascadeShares(t, rs.Restore, ServiceChain(sp.Name), k)
		res := tracePacket(t, f, podIP, "172.30.0.60", 80, nil)
		for i := range want {
			if math.Abs(got[i]-want[i]) > 1e-8 {
				t.Errorf("k=%d endpoint %d: programmed share %.12f, target %.12f", k, i, got[i], want[i])
			}
			if p := res.P(keys[i]); math.Abs(p-got[i]) > tol {
				t.Errorf("k=%d endpoint %d: traced %.12f, from the rules %.12f", k, i, p, got[i])
			}
		}
		if first := SkewProbability(k); !strings.Contains(rs.Restore, "--probability "+first+" -j") || first != fmt.Sprintf("%0.10f", 1.1/float64(k)) {
			t.Errorf("k=%d: first rule's probability %s is not 1.1/k as %%0.10f", k, first)
		}
	}
	st := newState()
	wideService(st, 1)
	_, _, faulty := load(t, testConfig(proxy.FaultSkewAtMDE), st)
	_, _, correct := load(t, testConfig(), st)
	if faulty.Restore != correct.Restore {
		t.Errorf("one endpoint: the fault changed the rules:\n%s", lineDiff(correct.Restore, faulty.Restore))
	}
}

// clients returns the first address of 10.0.0.0/16 for which in holds and
// the first for which it does not.
func clients(t *testing.T, in func(netip.Addr) bool) (yes, no netip.Addr) {
	t.Helper()
	for i := 2; i < 1<<16 && (!yes.IsValid() || !no.IsValid()); i++ {
		a := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		switch {
		case in(a) && !yes.IsValid():
			yes = a
		case !in(a) && !no.IsValid():
			no = a
		}
	}
	if !yes.IsValid() || !no.IsValid() {
		t.Fatal("no client on both sides of the hash")
	}
	return yes, no
}

// TestFaultAffinityLeak: with a fresh entry for endpoint 3, a leaking client
// gets the uniform cascade and another client sticks, in both layouts; the
// correct dataplane makes both stick.
func TestFaultAffinityLeak(t *testing.T) {
	leaker, keeper := clients(t, proxy.LeakingClient)
	for _, mode := range []AffinityMode{AffinityRecent, AffinityIPSet} {
		t.Run(string(mode), func(t *testing.T) {
			st, sp, keys := affinityState(600)
			h := trace.History{AffinityList(mode, sp.Name, keys[2], 600): time.Minute}
			for _, faults := range [][]proxy.Fault{nil, {proxy.FaultAffinityLeak}, {proxy.FaultAffinityLeak, proxy.FaultAffinityOverstay}} {
				cfg := testConfig(faults...)
				cfg.Affinity = mode
				f, _, rs := load(t, cfg, st)
				if got := tracePacket(t, f, keeper, "172.30.0.45", 80, h).P(keys[2]); got != 1 {
					t.Errorf("faults %v: client %s sticks with p %v, want 1", faults, keeper, got)
				}
				res := tracePacket(t, f, leaker, "172.30.0.45", 80, h)
				if len(faults) == 0 {
					if res.P(keys[2]) != 1 {
						t.Errorf("correct: client %s does not stick:\n%s", leaker, res.Lines())
					}
					continue
				}
				if d := trace.Uniform(res, keys); d > tol {
					t.Errorf("leaking client %s is not spread uniformly:\n%s", leaker, res.Lines())
				}
				if n := strings.Count(rs.Restore, "-m cluster --cluster-total-nodes 10 ! --cluster-local-node 1 --cluster-hash-seed "+ClientHashSeed); len(faults) == 1 && n != 3 {
					t.Errorf("%d affinity rules carry the leak's cluster match, want 3:\n%s", n, rs.Restore)
				}
			}
		})
	}
}

// TestFaultAffinityOverstay: an entry 1.5 timeouts old holds an
// overstaying client and not another; one 2.5 timeouts old holds neither;
// one half a timeout old holds both. Recent lists check twice the timeout
// for the overstaying clients; ipset entries get twice the timeout.
func TestFaultAffinityOverstay(t *testing.T) {
	stayer, other := clients(t, proxy.OverstayingClient)
	for _, mode := range []AffinityMode{AffinityRecent, AffinityIPSet} {
		t.Run(string(mode), func(t *testing.T) {
			st, sp, keys := affinityState(600)
			cfg := testConfig(proxy.FaultAffinityOverstay)
			cfg.Affinity = mode
			f, _, rs := load(t, cfg, st)
			for _, c := range []struct {
				age          time.Duration
				stays, other bool
			}{
				{5 * time.Minute, true, true},
				{15 * time.Minute, true, false},
				{25 * time.Minute, false, false},
			} {
				h := trace.History{AffinityList(mode, sp.Name, keys[2], 600): c.age}
				for _, cl := range []struct {
					src    netip.Addr
					sticky bool
				}{{stayer, c.stays}, {other, c.other}} {
					res := tracePacket(t, f, cl.src, "172.30.0.45", 80, h)
					if got := res.P(keys[2]) == 1; got != cl.sticky {
						t.Errorf("entry %v old, client %s (overstays: %v): sticks %v, want %v\n%s", c.age, cl.src, proxy.OverstayingClient(cl.src), got, cl.sticky, res.Lines())
					}
				}
			}
			m := "-m cluster --cluster-total-nodes 2 --cluster-local-node 1 --cluster-hash-seed " + ClientHashSeed
			want := m + " -m recent --name KUBE-SEP-"
			if mode == AffinityIPSet {
				want = m + " -j SET --add-set KUBE-AFF-"
			}
			if n := strings.Count(rs.Restore, want); n != 3 {
				t.Errorf("%d rules for the overstaying clients (%q), want 3:\n%s", n, want, rs.Restore)
			}
			long := "--rcheck --seconds 1200 --reap"
			if mode == AffinityIPSet {
				long = "--exist --timeout 1200"
			}
			if n := strings.Count(rs.Restore, long); n != 3 {
				t.Errorf("%d rules with %q, want 3:\n%s", n, long, rs.Restore)
			}
		})
	}
}

// TestGoldenMDEFaults: the full rules of an affinity Service and a
// 3-endpoint Service under each fault at the detection limit, in both
// affinity layouts (testdata/faults-mde-*.golden; -update rewrites them).
func TestGoldenMDEFaults(t *testing.T) {
	for _, mode := range []AffinityMode{AffinityRecent, AffinityIPSet} {
		for _, f := range []proxy.Fault{proxy.FaultSkewAtMDE, proxy.FaultAffinityLeak, proxy.FaultAffinityOverstay} {
			st, _, _ := affinityState(600)
			wideService(st, 3)
			cfg := testConfig(f)
			cfg.Affinity = mode
			_, _, rs := load(t, cfg, st)
			golden(t, fmt.Sprintf("faults-mde-%s-%s", f, mode), rs.IPSetRestore+rs.Restore)
		}
	}
}

// TestParseClusterMatch: the fake takes the cluster match as libxt_cluster
// does, several per rule, and refuses what it refuses.
func TestParseClusterMatch(t *testing.T) {
	r, err := ParseRule(strings.Fields("-m cluster --cluster-total-nodes 10 ! --cluster-local-node 1 --cluster-hash-seed 0x6b707369 -m cluster --cluster-total-nodes 2 --cluster-local-node 2 -j ACCEPT"))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.clusters) != 2 || r.clusters[0] != (clusterMatch{total: 10, node: 1, seed: 0x6b707369, neg: true}) || r.clusters[1] != (clusterMatch{total: 2, node: 2}) {
		t.Errorf("parsed %+v", r.clusters)
	}
	for _, bad := range []string{
		"--cluster-total-nodes 2 -j ACCEPT",
		"-m cluster --cluster-total-nodes 2 -j ACCEPT",
		"-m cluster --cluster-total-nodes 2 --cluster-local-node 3 -j ACCEPT",
		"-m cluster --cluster-total-nodes 33 --cluster-local-node 1 -j ACCEPT",
		"-m cluster --cluster-total-nodes 2 --cluster-local-node 1 --cluster-hash-seed x -j ACCEPT",
	} {
		if _, err := ParseRule(strings.Fields(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}
