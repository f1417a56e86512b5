package nftables

import (
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/dataplane/trace"
)

// The faults at the detection limit, in both layouts.

// TestFaultSkewAtMDE: the shares the programmed numgen values give are the
// fault's target shares (proxy.MDESkewShares), read from the
// kube-proxy layout's numgen map ranges and from the tracer in both layouts. One
// endpoint keeps all the traffic; the kube-proxy layout's table is the
// same, the fast layout writes it in its cascade form, as under
// uniform-probability.
func TestFaultSkewAtMDE(t *testing.T) {
	vmap := regexp.MustCompile(`numgen random mod (\d+) v?map \{ ([^}]*) \}`)
	for _, layout := range layouts {
		for _, k := range []int{1, 2, 3, 10, 20, 50} {
			st := newTestState()
			spn := addWide(st, k)
			_, f := load(t, testConfig(layout, proxy.FaultSkewAtMDE), st)
			want := proxy.MDESkewShares(k)
			res := tracePacket(t, f, podIP, fmt.Sprintf("172.30.1.%d", k), 80, nil)
			// The shares follow kube-proxy's endpoint order (by
			// "ip:port" string, proxy.SortEndpoints).
			eps := slices.Clone(st.Endpoints[spn])
			proxy.SortEndpoints(eps)
			for i, e := range eps {
				if got := res.P(e.String()); math.Abs(got-want[i]) > 1e-12 {
					t.Errorf("%s k=%d endpoint %d: traced share %.15f, target %.15f", layout, k, i, got, want[i])
				}
			}
			if layout != LayoutKubeProxy || k == 1 {
				continue
			}
			m := vmap.FindStringSubmatch(f.Dump())
			if m == nil {
				t.Fatalf("k=%d: no numgen map in\n%s", k, f.Dump())
			}
			mod, _ := strconv.ParseFloat(m[1], 64)
			if mod != float64(10*k*(k-1)) {
				t.Errorf("k=%d: modulus %v, want %d", k, mod, 10*k*(k-1))
			}
			for i, el := range strings.Split(m[2], " , ") {
				var lo, hi float64
				if _, err := fmt.Sscanf(el, "%f-%f", &lo, &hi); err != nil {
					t.Fatalf("k=%d: element %q: %v", k, el, err)
				}
				if got := (hi - lo + 1) / mod; math.Abs(got-want[i]) > 1e-15 {
					t.Errorf("k=%d endpoint %d: %v buckets of %v = %v, target %v", k, i, hi-lo+1, mod, got, want[i])
				}
			}
		}
		st := newTestState()
		addWide(st, 1)
		_, faulty := load(t, testConfig(layout, proxy.FaultSkewAtMDE), st)
		_, correct := load(t, testConfig(layout), st)
		if faulty.Dump() != correct.Dump() && layout == LayoutKubeProxy {
			t.Errorf("%s, one endpoint: the fault changed the table:\n%s", layout, lineDiff(correct.Dump(), faulty.Dump()))
		}
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

// TestFaultAffinityLeak: with a fresh entry for endpoint 2, a leaking client
// is spread uniformly and another sticks; without the fault both stick.
func TestFaultAffinityLeak(t *testing.T) {
	leaker, keeper := clients(t, proxy.LeakingClient)
	st, spn := affinityState(600)
	h := trace.History{AffinitySet(spn, "10.180.0.2:80"): time.Minute}
	for _, layout := range layouts {
		for _, faults := range [][]proxy.Fault{nil, {proxy.FaultAffinityLeak}, {proxy.FaultAffinityLeak, proxy.FaultAffinityOverstay}} {
			_, f := load(t, testConfig(layout, faults...), st)
			if got := tracePacket(t, f, keeper, "172.30.0.10", 80, h).P("10.180.0.2:80"); got != 1 {
				t.Errorf("%s %v: client %s sticks with p %v, want 1", layout, faults, keeper, got)
			}
			res := tracePacket(t, f, leaker, "172.30.0.10", 80, h)
			want := map[string]float64{"10.180.0.1:80": 1.0 / 3, "10.180.0.2:80": 1.0 / 3, "10.180.0.3:80": 1.0 / 3}
			if len(faults) == 0 {
				want = map[string]float64{"10.180.0.2:80": 1}
			}
			for e, p := range want {
				if got := res.P(e); math.Abs(got-p) > tol {
					t.Errorf("%s %v: client %s (leaks: %v): P(%s) = %v, want %v", layout, faults, leaker, len(faults) > 0, e, got, p)
				}
			}
			check := fmt.Sprintf("jhash ip saddr mod 10 seed %#x != 0 ip saddr @affinity-", proxy.ClientHashSeed)
			if n := strings.Count(f.Dump(), check); len(faults) == 1 && n != 3 {
				t.Errorf("%s: %d affinity checks behind the leak's jhash, want 3:\n%s", layout, n, f.Dump())
			}
		}
	}
}

// TestFaultAffinityOverstay: an entry 1.5 timeouts old holds an
// overstaying client and not another; 2.5 timeouts old, neither; half a
// timeout, both. The overstaying clients' updates carry twice the timeout.
func TestFaultAffinityOverstay(t *testing.T) {
	stayer, other := clients(t, proxy.OverstayingClient)
	st, spn := affinityState(600)
	for _, layout := range layouts {
		_, f := load(t, testConfig(layout, proxy.FaultAffinityOverstay), st)
		for _, c := range []struct {
			age          time.Duration
			stays, other bool
		}{
			{5 * time.Minute, true, true},
			{15 * time.Minute, true, false},
			{25 * time.Minute, false, false},
		} {
			h := trace.History{AffinitySet(spn, "10.180.0.2:80"): c.age}
			for _, cl := range []struct {
				src    netip.Addr
				sticky bool
			}{{stayer, c.stays}, {other, c.other}} {
				res := tracePacket(t, f, cl.src, "172.30.0.10", 80, h)
				if got := res.P("10.180.0.2:80") == 1; got != cl.sticky {
					t.Errorf("%s: entry %v old, client %s: sticks %v, want %v (%s)", layout, c.age, cl.src, got, cl.sticky, res)
				}
			}
		}
		long := fmt.Sprintf("jhash ip saddr mod 2 seed %#x == 0 ", proxy.ClientHashSeed)
		d := f.Dump()
		// kube-proxy: one update per endpoint chain; fast: the three
		// affinity rules and the three cascade rules.
		want := map[Layout]int{LayoutKubeProxy: 3, LayoutFast: 6}[layout]
		if n := strings.Count(d, "{ ip saddr timeout 1200s }"); n != want || strings.Count(d, long) != want {
			t.Errorf("%s: %d updates with twice the timeout, want %d:\n%s", layout, n, want, d)
		}
	}
}

// TestGoldenMDEFaults: the table of an affinity Service and a 3-endpoint
// Service under each fault at the detection limit, in both layouts
// (testdata/faults-mde-*.golden; -update rewrites them).
func TestGoldenMDEFaults(t *testing.T) {
	for _, layout := range layouts {
		for _, f := range []proxy.Fault{proxy.FaultSkewAtMDE, proxy.FaultAffinityLeak, proxy.FaultAffinityOverstay} {
			st, _ := affinityState(600)
			addWide(st, 3)
			_, fk := load(t, testConfig(layout, f), st)
			golden(t, fmt.Sprintf("faults-mde-%s-%s", f, layout), fk.Dump())
		}
	}
}
