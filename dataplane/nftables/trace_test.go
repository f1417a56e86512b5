package nftables

import (
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/dataplane/trace"
	"github.com/kpsim/kpsim/harness/testenv"
	"github.com/kpsim/kpsim/sim/cluster"
)

const tol = 1e-12

// TestTraceUniform: every endpoint of an n-endpoint service port gets 1/n,
// in both layouts, with and without affinity (a client with no history).
func TestTraceUniform(t *testing.T) {
	for _, layout := range layouts {
		for _, affinity := range []bool{false, true} {
			st := newTestState()
			for n := 1; n <= 20; n++ {
				spn := addWide(st, n)
				st.Services[spn].ClientIPAffinity, st.Services[spn].AffinityTimeout = affinity, 10800
			}
			_, f := load(t, testConfig(layout), st)
			tr := tracer(t, f)
			for n := 1; n <= 20; n++ {
				res, err := tr.Trace(trace.Packet{Src: podIP, Protocol: "tcp", Dst: netip.MustParseAddr(fmt.Sprintf("172.30.1.%d", n)), DPort: 80}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(res) != n {
					t.Errorf("%s affinity=%v n=%d: %d outcomes: %v", layout, affinity, n, len(res), res)
				}
				for _, o := range res {
					if math.Abs(o.P-1/float64(n)) > tol || o.Masquerade {
						t.Errorf("%s affinity=%v n=%d: %v", layout, affinity, n, res)
						break
					}
				}
			}
		}
	}
}

// affinityState has one service port with ClientIP affinity (timeout) over
// three endpoints.
func affinityState(timeout int32) (*cluster.State, cluster.ServicePortName) {
	st := newTestState()
	spn := name("ns", "aff", "p")
	sp := clusterIPPort(spn, "172.30.0.10", 80)
	sp.ClientIPAffinity, sp.AffinityTimeout = true, timeout
	add(st, sp, ep("10.180.0.1", 80, otherNode, "R"), ep("10.180.0.2", 80, otherNode, "R"), ep("10.180.0.3", 80, thisNode, "R"))
	return st, spn
}

func TestTraceAffinity(t *testing.T) {
	for _, layout := range layouts {
		st, spn := affinityState(600)
		_, f := load(t, testConfig(layout), st)
		set := AffinitySet(spn, "10.180.0.2:80")
		for _, c := range []struct {
			h    trace.History
			want string
		}{
			{nil, "10.180.0.1:80, 10.180.0.2:80, 10.180.0.3:80"},
			{trace.History{set: 10 * time.Second}, "10.180.0.2:80"},
			{trace.History{set: 599 * time.Second}, "10.180.0.2:80"},
			{trace.History{set: 600 * time.Second}, "10.180.0.1:80, 10.180.0.2:80, 10.180.0.3:80"},
			{trace.History{set: 2 * time.Hour}, "10.180.0.1:80, 10.180.0.2:80, 10.180.0.3:80"},
		} {
			if got := targets(tracePacket(t, f, podIP, "172.30.0.10", 80, c.h)); got != c.want {
				t.Errorf("%s history %v: %q, want %q", layout, c.h, got, c.want)
			}
		}
	}
}

// TestTraceHairpin: an endpoint reaching itself through its Service is
// masqueraded; reaching another endpoint it is not.
func TestTraceHairpin(t *testing.T) {
	for _, layout := range layouts {
		st := newTestState()
		add(st, clusterIPPort(name("ns", "svc", "p"), "172.30.0.10", 80), ep("10.180.0.1", 80, thisNode, "R"), ep("10.180.0.2", 80, otherNode, "R"))
		_, f := load(t, testConfig(layout), st)
		got := tracePacket(t, f, netip.MustParseAddr("10.180.0.1"), "172.30.0.10", 80, nil).String()
		want := "10.180.0.1:80 masq 0.500000, 10.180.0.2:80 0.500000"
		if got != want {
			t.Errorf("%s: %s, want %s", layout, got, want)
		}
	}
}

// TestTraceInternalTrafficPolicy: kube-proxy's TestInternalTrafficPolicy
// vectors (reference §4.3).
func TestTraceInternalTrafficPolicy(t *testing.T) {
	for _, layout := range layouts {
		for _, c := range []struct {
			name  string
			local bool
			nodes []string
			want  string
		}{
			{"ITP Cluster", false, []string{thisNode, otherNode, otherNode}, "10.0.1.1:80, 10.0.1.2:80, 10.0.1.3:80"},
			{"ITP Local, one local", true, []string{thisNode, otherNode, otherNode}, "10.0.1.1:80"},
			{"ITP Local, two local", true, []string{thisNode, thisNode, otherNode}, "10.0.1.1:80, 10.0.1.2:80"},
			{"ITP Local, none local", true, []string{otherNode, otherNode, otherNode}, trace.OutcomeDrop},
		} {
			st := newTestState()
			sp := clusterIPPort(name("ns1", "svc1", ""), "172.30.1.1", 80)
			sp.InternalLocal = c.local
			var eps []*cluster.Endpoint
			for i, n := range c.nodes {
				eps = append(eps, ep(fmt.Sprintf("10.0.1.%d", i+1), 80, n, "R"))
			}
			add(st, sp, eps...)
			_, f := load(t, testConfig(layout), st)
			if got := targets(tracePacket(t, f, netip.MustParseAddr("10.0.0.2"), "172.30.1.1", 80, nil)); got != c.want {
				t.Errorf("%s %s: %q, want %q", layout, c.name, got, c.want)
			}
		}
	}
}

// TestTraceTerminating runs the reference vectors with traffic outcomes
// (harness/testenv/testdata/vectors.yaml: kube-proxy's
// TestTerminatingEndpointsTrafficPolicy*, reference §4.3, and the
// internalTrafficPolicy cases) in both layouts, with the node port standing
// in for the load-balancer IP.
func TestTraceTerminating(t *testing.T) {
	for _, layout := range layouts {
		for _, c := range testenv.TrafficVectors(t) {
			st, sp := dataplanetest.VectorState(c)
			internal, ext := dataplanetest.VectorTargets(c, "nftables")
			b, f := load(t, testConfig(layout), st)
			check := func(when, internal, ext string) {
				t.Helper()
				if got := targets(tracePacket(t, f, podIP, "172.30.1.1", 80, nil)); got != internal {
					t.Errorf("%s %s%s: pod to cluster IP %q, want %q", layout, c.Name, when, got, internal)
				}
				if ext == "" {
					return
				}
				if got := targets(tracePacket(t, f, extIP, nodeIP.String(), int(sp.NodePort), nil)); got != ext {
					t.Errorf("%s %s%s: external to node port %q, want %q", layout, c.Name, when, got, ext)
				}
			}
			check("", internal, ext)
			// After the endpoints are deleted, both flows are rejected.
			delete(st.Endpoints, sp.Name)
			sync(t, b, st, []cluster.ServicePortName{sp.Name}, false)
			if ext != "" {
				ext = trace.OutcomeReject
			}
			check(" (after endpoints deleted)", trace.OutcomeReject, ext)
		}
	}
}

// TestTraceLayoutsAgree: both layouts give the same outcomes, with the same
// probabilities, for every flow of every test state, with and without
// affinity history, and under each fault.
func TestTraceLayoutsAgree(t *testing.T) {
	states := map[string]func() *cluster.State{
		"overall": overallState,
		"affinity": func() *cluster.State {
			st, _ := affinityState(600)
			return st
		},
		"wide": func() *cluster.State {
			st := newTestState()
			for n := 1; n <= 12; n++ {
				addWide(st, n)
			}
			return st
		},
	}
	faultSets := [][]string{nil}
	for _, f := range allFaults() {
		faultSets = append(faultSets, []string{f})
	}
	for sname, mk := range states {
		for _, faults := range faultSets {
			st := mk()
			var tables []string
			for _, layout := range layouts {
				cfg := testConfig(layout)
				for _, f := range faults {
					cfg.Faults[faultNamed(f)] = true
				}
				_, f := load(t, cfg, st)
				tables = append(tables, traceTable(t, f, st)+affinityTable(t, f, st))
			}
			if testing.Verbose() && sname == "affinity" {
				t.Logf("%v:\n%s", faults, tables[0])
			}
			if tables[0] != tables[1] {
				t.Errorf("state %s faults %v: layouts disagree:\n%s", sname, faults, lineDiff(tables[0], tables[1]))
			}
		}
	}
}

// affinityTable traces a pod client remembered by each endpoint's affinity
// set in turn, at half and at twice the timeout.
func affinityTable(t *testing.T, f *knftables.Fake, st *cluster.State) string {
	t.Helper()
	tr := tracer(t, f)
	var b strings.Builder
	for _, spn := range st.SortedServicePorts() {
		sp := st.Services[spn]
		if !sp.ClientIPAffinity {
			continue
		}
		timeout := time.Duration(sp.AffinityTimeout) * time.Second
		for _, e := range st.Endpoints[spn] {
			for _, age := range []time.Duration{timeout / 2, 2 * timeout} {
				h := trace.History{AffinitySet(spn, e.String()): age}
				res, err := tr.Trace(trace.Packet{Src: podIP, Protocol: "tcp", Dst: sp.ClusterIP, DPort: int(sp.Port)}, h)
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(&b, "%s remembered by %s for %s: %s\n", spn, e, age, res)
			}
		}
	}
	return b.String()
}

func allFaults() []string { return proxy.FaultNames() }
