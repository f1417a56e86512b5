package nftables

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/dataplane/trace"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Each named fault must change what the tracer sees, in the way its
// documentation says, in both layouts; the correct renderer is the baseline.

func TestFaultUniformProbability(t *testing.T) {
	for _, layout := range layouts {
		for _, affinity := range []bool{false, true} {
			st := newTestState()
			sp := clusterIPPort(name("ns", "svc", "p"), "172.30.0.10", 80)
			sp.ClientIPAffinity, sp.AffinityTimeout = affinity, 600
			add(st, sp, ep("10.180.0.1", 80, otherNode, "R"), ep("10.180.0.2", 80, otherNode, "R"), ep("10.180.0.3", 80, otherNode, "R"))
			spn12 := addWide(st, 12)
			st.Services[spn12].ClientIPAffinity, st.Services[spn12].AffinityTimeout = affinity, 600
			_, f := load(t, testConfig(layout, proxy.FaultUniformProbability), st)
			res := tracePacket(t, f, podIP, "172.30.0.10", 80, nil)
			for ep, want := range map[string]float64{"10.180.0.1:80": 1.0 / 3, "10.180.0.2:80": 2.0 / 9, "10.180.0.3:80": 4.0 / 9} {
				if got := res.P(ep); math.Abs(got-want) > tol {
					t.Errorf("%s affinity=%v: P(%s) = %v, want %v", layout, affinity, ep, got, want)
				}
			}
			// 12 endpoints: weights rounded to 2^-31 (12^11 > 2^31).
			// The cascade follows kube-proxy's endpoint order (by
			// "ip:port" string, proxy.SortEndpoints).
			res = tracePacket(t, f, podIP, "172.30.1.12", 80, nil)
			eps := slices.Clone(st.Endpoints[spn12])
			proxy.SortEndpoints(eps)
			p := 1.0
			for i, e := range eps {
				want := p / 12
				if i == 11 {
					want = p
				}
				if got := res.P(e.String()); math.Abs(got-want) > 1e-8 {
					t.Errorf("%s affinity=%v: endpoint %d of 12: P = %v, want %v", layout, affinity, i, got, want)
				}
				p *= 11.0 / 12
			}
			// kube-proxy: weighted numgen buckets; fast: a cascade.
			if w := map[Layout]string{LayoutKubeProxy: "0-2 : 10.180.0.1 . 80", LayoutFast: "numgen random mod 3 == 0"}[layout]; !affinity && strings.Count(f.Dump(), w) != 1+btoi(layout == LayoutFast) {
				t.Errorf("%s: %q not found as expected in\n%s", layout, w, f.Dump())
			}
		}
	}
}

func TestSkewWeights(t *testing.T) {
	for n := 1; n <= 20; n++ {
		w := SkewWeights(n)
		var sum uint64
		for _, x := range w {
			sum += x
		}
		p := 1.0
		for i, x := range w {
			want := p / float64(n)
			if i == n-1 {
				want = p
			}
			// Each weight rounds to 2^-31; the last absorbs the n-1 roundings.
			if got := float64(x) / float64(sum); math.Abs(got-want) > float64(n)/(1<<31) {
				t.Errorf("n=%d: weight %d is %v, want %v", n, i, got, want)
			}
			p *= 1 - 1/float64(n)
		}
	}
	if w := SkewWeights(3); w[0] != 3 || w[1] != 2 || w[2] != 4 {
		t.Errorf("SkewWeights(3) = %v, want [3 2 4]", w)
	}
}

func TestFaultKeepNotReady(t *testing.T) {
	st := newTestState()
	add(st, clusterIPPort(name("ns", "svc", "p"), "172.30.0.10", 80),
		ep("10.180.0.1", 80, otherNode, "R"), ep("10.180.0.2", 80, otherNode, ""), ep("10.180.0.3", 80, otherNode, "T"))
	faultCases(t, st, "172.30.0.10", nil, proxy.FaultKeepNotReady,
		"10.180.0.1:80", "10.180.0.1:80, 10.180.0.2:80, 10.180.0.3:80")
}

func TestFaultIgnoreLocalPolicy(t *testing.T) {
	st := newTestState()
	sp := clusterIPPort(name("ns", "svc", "p"), "172.30.0.10", 80)
	sp.InternalLocal = true
	add(st, sp, ep("10.180.0.1", 80, otherNode, "R"), ep("10.180.0.2", 80, otherNode, "R"))
	faultCases(t, st, "172.30.0.10", nil, proxy.FaultIgnoreLocalPolicy,
		trace.OutcomeDrop, "10.180.0.1:80, 10.180.0.2:80")
}

func TestFaultAffinityNoTimeout(t *testing.T) {
	st, spn := affinityState(600)
	h := trace.History{AffinitySet(spn, "10.180.0.2:80"): 2 * time.Hour}
	faultCases(t, st, "172.30.0.10", h, proxy.FaultAffinityNoTimeout,
		"10.180.0.1:80, 10.180.0.2:80, 10.180.0.3:80", "10.180.0.2:80")
	for _, layout := range layouts {
		_, f := load(t, testConfig(layout, proxy.FaultAffinityNoTimeout), st)
		if d := f.Dump(); strings.Contains(d, "timeout") || !strings.Contains(d, "flags dynamic ;") {
			t.Errorf("%s: affinity sets with a timeout under the fault:\n%s", layout, d)
		}
	}
}

func TestFaultDropLastEndpoint(t *testing.T) {
	st := newTestState()
	add(st, clusterIPPort(name("ns", "svc", "p"), "172.30.0.10", 80),
		ep("10.180.0.1", 80, otherNode, "R"), ep("10.180.0.2", 80, otherNode, "R"), ep("10.180.0.3", 80, otherNode, "R"))
	add(st, clusterIPPort(name("ns", "one", "p"), "172.30.0.11", 80), ep("10.180.0.4", 80, otherNode, "R"))
	faultCases(t, st, "172.30.0.10", nil, proxy.FaultDropLastEndpoint,
		"10.180.0.1:80, 10.180.0.2:80, 10.180.0.3:80", "10.180.0.1:80, 10.180.0.2:80")
	// A single endpoint gets nothing: the connection is not DNATed and
	// cluster-ips-check rejects it.
	faultCases(t, st, "172.30.0.11", nil, proxy.FaultDropLastEndpoint, "10.180.0.4:80", trace.OutcomeReject)
}

func TestFaultKeepDeletedEndpoint(t *testing.T) {
	for _, layout := range layouts {
		for _, fault := range []bool{false, true} {
			st := newTestState()
			spn := name("ns", "svc", "p")
			add(st, clusterIPPort(spn, "172.30.0.10", 80), ep("10.180.0.1", 80, otherNode, "R"), ep("10.180.0.2", 80, otherNode, "R"))
			cfg := testConfig(layout)
			if fault {
				cfg = testConfig(layout, proxy.FaultKeepDeletedEndpoint)
			}
			b, f := load(t, cfg, st)
			st.Endpoints[spn] = st.Endpoints[spn][:1]
			sync(t, b, st, []cluster.ServicePortName{spn}, false)
			got := targets(tracePacket(t, f, podIP, "172.30.0.10", 80, nil))
			want := "10.180.0.1:80"
			if fault {
				want = "10.180.0.1:80, 10.180.0.2:80"
			}
			if got != want {
				t.Errorf("%s fault=%v: %q, want %q", layout, fault, got, want)
			}
		}
	}
}

// faultCases traces a pod to dst:80 in both layouts without and with the
// fault.
func faultCases(t *testing.T, st *cluster.State, dst string, h trace.History, fault proxy.Fault, without, with string) {
	t.Helper()
	for _, layout := range layouts {
		for _, c := range []struct {
			cfg  Config
			want string
		}{{testConfig(layout), without}, {testConfig(layout, fault), with}} {
			_, f := load(t, c.cfg, st)
			if got := targets(tracePacket(t, f, podIP, dst, 80, h)); got != c.want {
				t.Errorf("%s faults %v: %q, want %q", layout, c.cfg.Faults, got, c.want)
			}
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
