package iptables

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/dataplane/trace"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Each named fault must change what the tracer sees, in the way its
// documentation says; the correct renderer is the baseline.

func TestFaultUniformProbability(t *testing.T) {
	st := newState()
	add(st, clusterIPPort(name("ns", "svc", "p"), "172.30.0.10", 80),
		ep("10.180.0.1", 80, otherNode, "R"), ep("10.180.0.2", 80, otherNode, "R"), ep("10.180.0.3", 80, otherNode, "R"))
	f, _, rs := load(t, testConfig(proxy.FaultUniformProbability), st)
	res := tracePacket(t, f, podIP, "172.30.0.10", 80, nil)
	for ep, want := range map[string]float64{"10.180.0.1:80": 1.0 / 3, "10.180.0.2:80": 2.0 / 9, "10.180.0.3:80": 4.0 / 9} {
		if got := res.P(ep); math.Abs(got-want) > tol {
			t.Errorf("P(%s) = %v, want %v", ep, got, want)
		}
	}
	if strings.Count(rs.Restore, "--probability 0.3333333333") != 2 {
		t.Errorf("want both cascade rules at 1/3:\n%s", rs.Restore)
	}
}

func TestFaultKeepNotReady(t *testing.T) {
	st := newState()
	add(st, clusterIPPort(name("ns", "svc", "p"), "172.30.0.10", 80),
		ep("10.180.0.1", 80, otherNode, "R"), ep("10.180.0.2", 80, otherNode, ""), ep("10.180.0.3", 80, otherNode, "T"))
	for _, c := range []struct {
		faults []proxy.Fault
		want   string
	}{
		{nil, "10.180.0.1:80"},
		{[]proxy.Fault{proxy.FaultKeepNotReady}, "10.180.0.1:80, 10.180.0.2:80, 10.180.0.3:80"},
	} {
		f, _, _ := load(t, testConfig(c.faults...), st)
		if got := targets(tracePacket(t, f, podIP, "172.30.0.10", 80, nil)); got != c.want {
			t.Errorf("faults %v: %q, want %q", c.faults, got, c.want)
		}
	}
}

func TestFaultIgnoreLocalPolicy(t *testing.T) {
	st := newState()
	sp := clusterIPPort(name("ns", "svc", "p"), "172.30.0.10", 80)
	sp.InternalLocal = true
	add(st, sp, ep("10.180.0.1", 80, otherNode, "R"), ep("10.180.0.2", 80, otherNode, "R"))
	for _, c := range []struct {
		faults []proxy.Fault
		want   string
	}{
		{nil, trace.OutcomeDrop},
		{[]proxy.Fault{proxy.FaultIgnoreLocalPolicy}, "10.180.0.1:80, 10.180.0.2:80"},
	} {
		f, _, _ := load(t, testConfig(c.faults...), st)
		if got := targets(tracePacket(t, f, podIP, "172.30.0.10", 80, nil)); got != c.want {
			t.Errorf("faults %v: %q, want %q", c.faults, got, c.want)
		}
	}
}

func TestFaultAffinityNoTimeout(t *testing.T) {
	for _, mode := range []AffinityMode{AffinityRecent, AffinityIPSet} {
		t.Run(string(mode), func(t *testing.T) {
			st, sp, keys := affinityState(600)
			old := 2 * time.Hour
			for _, c := range []struct {
				faults  []proxy.Fault
				timeout int
				sticky  bool
			}{
				{nil, 600, false},
				{[]proxy.Fault{proxy.FaultAffinityNoTimeout}, -1, true},
			} {
				cfg := testConfig(c.faults...)
				cfg.Affinity = mode
				f, _, rs := load(t, cfg, st)
				h := trace.History{AffinityList(mode, sp.Name, keys[2], c.timeout): old}
				res := tracePacket(t, f, podIP, "172.30.0.45", 80, h)
				if got := res.P(keys[2]) == 1; got != c.sticky {
					t.Errorf("faults %v: entry %v old sticks = %v, want %v\n%s", c.faults, old, got, c.sticky, res.Lines())
				}
				if c.sticky && (strings.Contains(rs.Restore, "--seconds") || strings.Contains(rs.Restore, "--timeout") || strings.Contains(rs.IPSetRestore, "timeout")) {
					t.Errorf("a timeout is still rendered:\n%s%s", rs.IPSetRestore, rs.Restore)
				}
			}
		})
	}
}

func TestFaultKeepDeletedEndpoint(t *testing.T) {
	for _, c := range []struct {
		faults []proxy.Fault
		want   string
	}{
		{nil, "10.180.0.1:80"},
		{[]proxy.Fault{proxy.FaultKeepDeletedEndpoint}, "10.180.0.1:80, 10.180.0.2:80"},
	} {
		st := newState()
		sp := clusterIPPort(name("ns", "svc", "p"), "172.30.0.10", 80)
		add(st, sp, ep("10.180.0.1", 80, otherNode, "R"), ep("10.180.0.2", 80, otherNode, "R"))
		f, b, _ := load(t, testConfig(c.faults...), st)
		st.Endpoints[sp.Name] = st.Endpoints[sp.Name][:1]
		apply(t, b, st, []cluster.ServicePortName{sp.Name}, false)
		if got := targets(tracePacket(t, f, podIP, "172.30.0.10", 80, nil)); got != c.want {
			t.Errorf("faults %v: after delete %q, want %q", c.faults, got, c.want)
		}
	}
}

func TestFaultDropLastEndpoint(t *testing.T) {
	st := newState()
	add(st, clusterIPPort(name("ns", "svc", "p"), "172.30.0.10", 80),
		ep("10.180.0.1", 80, otherNode, "R"), ep("10.180.0.2", 80, otherNode, "R"), ep("10.180.0.3", 80, otherNode, "R"))
	add(st, clusterIPPort(name("ns", "one", "p"), "172.30.0.11", 80), ep("10.180.0.4", 80, otherNode, "R"))
	f, _, _ := load(t, testConfig(proxy.FaultDropLastEndpoint), st)
	res := tracePacket(t, f, podIP, "172.30.0.10", 80, nil)
	if d := trace.Uniform(res, []string{"10.180.0.1:80", "10.180.0.2:80"}); d > tol {
		t.Errorf("want 1/2 each on the first two endpoints:\n%s", res.Lines())
	}
	if got := targets(tracePacket(t, f, podIP, "172.30.0.11", 80, nil)); got != trace.OutcomeAccept {
		t.Errorf("single endpoint dropped: %q, want the packet left un-NATed", got)
	}
}

// TestFaultsRenderCleanly: every fault, alone and all together, still gives
// a ruleset that iptables-restore (the fake) accepts, in both affinity modes.
func TestFaultsRenderCleanly(t *testing.T) {
	for _, mode := range []AffinityMode{AffinityRecent, AffinityIPSet} {
		all := proxy.AllFaults()
		for _, fs := range append([][]proxy.Fault{all}, splitEach(all)...) {
			cfg := testConfig(fs...)
			cfg.Affinity = mode
			st := overallState()
			_, b, _ := load(t, cfg, st)
			delete(st.Endpoints, name("ns1", "svc1", "p80"))
			apply(t, b, st, []cluster.ServicePortName{name("ns1", "svc1", "p80")}, false)
		}
	}
}

func splitEach(fs []proxy.Fault) [][]proxy.Fault {
	var out [][]proxy.Fault
	for _, f := range fs {
		out = append(out, []proxy.Fault{f})
	}
	return out
}
