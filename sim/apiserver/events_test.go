package apiserver

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

func spn(ns, name, port string) cluster.ServicePortName {
	return cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: corev1.ProtocolTCP}
}

// conds renders each endpoint as "ip:R|S|T" letters for compact comparison.
func conds(eps []*cluster.Endpoint) []string {
	var out []string
	for _, e := range eps {
		s := e.IP.String() + ":"
		for _, c := range []struct {
			on bool
			l  string
		}{{e.Ready, "R"}, {e.Serving, "S"}, {e.Terminating, "T"}} {
			if c.on {
				s += c.l
			} else {
				s += "-"
			}
		}
		out = append(out, s)
	}
	return out
}

// applyAll applies each step, waits until the tracker has received every
// write the step made, and returns the endpoints after it.
func applyAll(t *testing.T, m *Model, name cluster.ServicePortName) [][]string {
	t.Helper()
	var out [][]string
	for _, s := range Timeline(m.Loaded.Scenario) {
		st, _ := applyDrain(t, m, s)
		out = append(out, conds(st.Endpoints[name]))
	}
	return out
}

// applyDrain applies one step and drains the tracker once it has seen all
// of the step's writes.
func applyDrain(t *testing.T, m *Model, s Step) (*cluster.State, cluster.Changes) {
	t.Helper()
	before := m.Tracker.Seq()
	n, err := m.Cluster.Apply(context.Background(), s)
	if err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	if n == 0 {
		t.Fatalf("%s: no API write", s)
	}
	waitSeq(t, m.Tracker, before+uint64(n))
	return m.Tracker.Drain()
}

// informerTimeout bounds the wait for the fake clientset's informers; it
// is a bound on a hang, not a retry: the wait ends as soon as the events
// have arrived.
const informerTimeout = 10 * time.Second

// waitSeq blocks until the tracker has received target events in all
// (cluster.Tracker.Seq, as harness/conform's settle does), woken by Changed; it
// fails the test if they do not arrive within informerTimeout.
func waitSeq(t *testing.T, tr *cluster.Tracker, target uint64) {
	t.Helper()
	timeout := time.NewTimer(informerTimeout)
	defer timeout.Stop()
	for tr.Seq() < target {
		select {
		case <-tr.Changed():
		case <-timeout.C:
			t.Fatalf("the tracker received %d events, want %d: the informers did not deliver the writes within %s", tr.Seq(), target, informerTimeout)
		}
	}
}

// paths are the two ways a Cluster gets its objects: loaded into the fake
// clientset's tracker (Open), and written through the clientset by Seed
// into a Cluster made by Connect, as over a real API server. Every timeline
// test runs on both.
var paths = []struct {
	name string
	open func(testing.TB, string) *Model
}{{"load", open}, {"connect", connected}}

func TestTimelineFlap(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) { testTimelineFlap(t, p.open(t, "../../scenarios/conformance/flapping.yaml")) })
	}
}

func testTimelineFlap(t *testing.T, m *Model) {
	steps := Timeline(m.Loaded.Scenario)
	if len(steps) != 8 {
		t.Fatalf("a flap with count 4 gives 8 writes, got %d", len(steps))
	}
	if steps[0].At != time.Second || steps[1].At != 3*time.Second || steps[2].At != 6*time.Second {
		t.Errorf("flap times %v %v %v, want 1s 3s 6s (period 5s, duty 0.4)", steps[0].At, steps[1].At, steps[2].At)
	}
	got := applyAll(t, m, spn("demo", "flappy", "http"))
	for i, g := range got {
		want := "10.244.1.61:RS-"
		if i%2 == 0 {
			want = "10.244.1.61:---"
		}
		if g[2] != want || g[0] != "10.244.0.60:RS-" {
			t.Errorf("after step %d: %v, want the flapping endpoint %s", i, g, want)
		}
	}
}

func TestTimelineTerminating(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			testTimelineTerminating(t, p.open(t, "../../scenarios/conformance/terminating.yaml"))
		})
	}
}

func testTimelineTerminating(t *testing.T, m *Model) {
	got := applyAll(t, m, spn("demo", "draining", "http"))
	want := [][]string{
		// delete-pod draining-0: the ready endpoint becomes serving+terminating
		{"10.244.0.70:-ST", "10.244.1.70:-ST", "10.244.1.71:-ST", "10.244.1.72:--T"},
		// grace period over: removed
		{"10.244.1.70:-ST", "10.244.1.71:-ST", "10.244.1.72:--T"},
		// the serving ones stop serving
		{"10.244.1.70:--T", "10.244.1.71:-ST", "10.244.1.72:--T"},
		{"10.244.1.70:--T", "10.244.1.71:--T", "10.244.1.72:--T"},
	}
	// Steps at the same time keep file order: 5s terminate, 10s remove, 12s, 12s.
	if len(got) != len(want) {
		t.Fatalf("got %d states, want %d: %v", len(got), len(want), got)
	}
	for i := range want {
		if len(got[i]) != len(want[i]) {
			t.Errorf("step %d: %v, want %v", i, got[i], want[i])
			continue
		}
		for j := range want[i] {
			if got[i][j] != want[i][j] {
				t.Errorf("step %d: %v, want %v", i, got[i], want[i])
				break
			}
		}
	}
}

func TestScaleAndServiceUpdate(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			testScaleAndServiceUpdate(t, p.open(t, "../../scenarios/conformance/distribution.yaml"))
		})
	}
}

func testScaleAndServiceUpdate(t *testing.T, m *Model) {
	web := spn("demo", "web", "http")
	st, ch := applyDrain(t, m, Step{Action: ActScale, Service: "demo/web", Replicas: 5})
	if len(st.Endpoints[web]) != 5 || len(ch.Endpoints) != 1 {
		t.Fatalf("scale up: %v (changes %+v)", conds(st.Endpoints[web]), ch)
	}
	st, _ = applyDrain(t, m, Step{Action: ActScale, Service: "demo/web", Replicas: 1})
	if len(st.Endpoints[web]) != 1 {
		t.Fatalf("scale down: %v", conds(st.Endpoints[web]))
	}
	timeout := int32(5)
	st, _ = applyDrain(t, m, Step{Action: ActServiceUpdate, Service: "demo/web", Update: &scenarioEventT{SessionAffinity: "ClientIP", AffinityTimeout: &timeout, InternalTrafficPolicy: "Local"}})
	if sp := st.Services[web]; !sp.ClientIPAffinity || sp.AffinityTimeout != 5 || !sp.InternalLocal {
		t.Errorf("service update not applied: %+v", sp)
	}
}

type scenarioEventT = scenario.Event

func TestAddAndRestore(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			m := p.open(t, "../../scenarios/conformance/distribution.yaml")
			web := spn("demo", "web", "http")
			st0, _ := m.Tracker.Drain()
			before := conds(st0.Endpoints[web])
			snap, err := m.Cluster.Snapshot(context.Background(), "demo/web")
			if err != nil {
				t.Fatal(err)
			}
			first := st0.Endpoints[web][0]
			st, _ := applyDrain(t, m, Step{Action: ActRemove, Service: "demo/web", Endpoint: first.IP.String()})
			node := first.NodeName
			free := topAddr(st.Nodes[node].PodCIDR)
			st, _ = applyDrain(t, m, Step{Action: ActAdd, Service: "demo/web", Endpoint: free.String(), Node: node})
			if !slices.ContainsFunc(st.Endpoints[web], func(e *cluster.Endpoint) bool { return e.IP == free && e.Ready && e.NodeName == node }) {
				t.Fatalf("add: %v", conds(st.Endpoints[web]))
			}
			if _, err := m.Cluster.Apply(context.Background(), Step{Action: ActAdd, Service: "demo/web", Endpoint: free.String(), Node: node}); err == nil {
				t.Error("adding an endpoint address twice was not refused")
			}
			st, _ = applyDrain(t, m, Step{Action: ActRestore, Service: "demo/web", Snapshot: snap})
			if got := conds(st.Endpoints[web]); !slices.Equal(got, before) {
				t.Errorf("restore: %v, want %v", got, before)
			}
		})
	}
}

// topAddr is the last host address of p.
func topAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 2
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
