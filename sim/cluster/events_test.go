package cluster

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/sim/scenario"
)

func spn(ns, name, port string) ServicePortName {
	return ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: corev1.ProtocolTCP}
}

// conds renders each endpoint as "ip:R|S|T" letters for compact comparison.
func conds(eps []*Endpoint) []string {
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

// applyAll applies each step and returns the endpoints after it (bounded
// wait for the informer).
func applyAll(t *testing.T, m *Model, name ServicePortName) [][]string {
	t.Helper()
	var out [][]string
	for _, s := range Timeline(m.Loaded.Scenario) {
		if _, err := m.Cluster.Apply(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for !m.Tracker.Pending() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond)
		st, _ := m.Tracker.Drain()
		out = append(out, conds(st.Endpoints[name]))
	}
	return out
}

func TestTimelineFlap(t *testing.T) {
	m := open(t, "../../scenarios/conformance/flapping.yaml")
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
	m := open(t, "../../scenarios/conformance/terminating.yaml")
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
	m := open(t, "../../scenarios/conformance/distribution.yaml")
	ctx := context.Background()
	web := spn("demo", "web", "http")
	if _, err := m.Cluster.Apply(ctx, Step{Action: ActScale, Service: "demo/web", Replicas: 5}); err != nil {
		t.Fatal(err)
	}
	ch := waitDrain(t, m.Tracker)
	st, _ := m.Tracker.Drain()
	if len(st.Endpoints[web]) != 5 || len(ch.Endpoints) != 1 {
		t.Fatalf("scale up: %v (changes %+v)", conds(st.Endpoints[web]), ch)
	}
	if _, err := m.Cluster.Apply(ctx, Step{Action: ActScale, Service: "demo/web", Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	waitDrain(t, m.Tracker)
	if len(st.Endpoints[web]) != 1 {
		t.Fatalf("scale down: %v", conds(st.Endpoints[web]))
	}
	timeout := int32(5)
	if _, err := m.Cluster.Apply(ctx, Step{Action: ActServiceUpdate, Service: "demo/web", Update: &scenarioEventT{SessionAffinity: "ClientIP", AffinityTimeout: &timeout, InternalTrafficPolicy: "Local"}}); err != nil {
		t.Fatal(err)
	}
	waitDrain(t, m.Tracker)
	if sp := st.Services[web]; !sp.ClientIPAffinity || sp.AffinityTimeout != 5 || !sp.InternalLocal {
		t.Errorf("service update not applied: %+v", sp)
	}
}

type scenarioEventT = scenario.Event
