package simulate

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/report"
)

func simulate(t *testing.T, file string, seed *uint64, o Options) *report.Report {
	t.Helper()
	m, err := apiserver.Open(context.Background(), file, seed)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := Run(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func encode(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func unit(t *testing.T, r *report.Report, mode cluster.Mode, check string) report.Unit {
	t.Helper()
	for _, c := range r.Checks {
		if c.Mode == mode && c.Name == check {
			if len(c.Units) != 1 {
				t.Fatalf("%s %s: %d units, want 1", mode, check, len(c.Units))
			}
			return c.Units[0]
		}
	}
	t.Fatalf("no check %s in mode %s", check, mode)
	return report.Unit{}
}

// TestFlipByHand checks the exposure window and the misrouted connections
// against the figures worked out in testdata/flip.yaml: with instant syncs
// and minSyncPeriod 1 s, the readiness write at 1.2 s waits for the sync
// at 2.1 s on both nodes (0.9 s), the others are applied at once; the
// 1-ms arrival slots put exactly 900 connections per node in the window.
func TestFlipByHand(t *testing.T) {
	r := simulate(t, "testdata/flip.yaml", nil, Options{SyncTime: func(cluster.Mode, int, bool) time.Duration { return 0 }})
	if len(r.Failed) > 0 {
		t.Fatalf("checks failed: %v", r.Failed)
	}
	if len(r.Steps) != 8 {
		t.Fatalf("%d steps, want 8", len(r.Steps))
	}
	for _, m := range r.Modes {
		if m.Connections.Total != 20000 {
			t.Errorf("%s: %d connections, want 20000", m.Mode, m.Connections.Total)
		}
		for k, sw := range m.Flapping.Steps {
			want := 0.0
			if k == 4 || k == 5 { // the two writes at 1.2 s
				want = 0.9
			}
			if math.Abs(sw.WindowP50Seconds-want) > 1e-9 || math.Abs(sw.WindowMaxSeconds-want) > 1e-9 {
				t.Errorf("%s step %d at %gs: window p50 %g max %g, want %g", m.Mode, k+1, sw.AtSeconds, sw.WindowP50Seconds, sw.WindowMaxSeconds, want)
			}
		}
		if m.Flapping.MismatchedAfterSync != 0 {
			t.Errorf("%s: %d connections disagreed with the oracle after a sync", m.Mode, m.Flapping.MismatchedAfterSync)
		}
		one := unit(t, r, m.Mode, "flapping:demo/one:http")
		if one.InWindow != 900 || one.Misrouted != 900 {
			t.Errorf("%s demo/one: %d in window, %d misrouted; want 900 and 900 (every connection of [1.2 s, 2.1 s) reaches the not-ready endpoint)", m.Mode, one.InWindow, one.Misrouted)
		}
		two := unit(t, r, m.Mode, "flapping:demo/two:http")
		if two.InWindow != 900 {
			t.Errorf("%s demo/two: %d in window, want 900", m.Mode, two.InWindow)
		}
		if m.Mode == "ipvs" {
			if two.Misrouted != 450 {
				t.Errorf("ipvs rr alternates: %d misrouted, want exactly 450", two.Misrouted)
			}
			continue
		}
		// Binomial(900, 1/2): 450 ± 4σ (σ = 15).
		if two.Misrouted < 390 || two.Misrouted > 510 {
			t.Errorf("%s demo/two: %d misrouted, want about 450", m.Mode, two.Misrouted)
		}
	}
}

// TestFlipSyncTime: with the cost model's sync time d, every window is d
// longer (the write at 1.2 s waits for the sync at 1.1 s + d + 1 s).
func TestFlipSyncTime(t *testing.T) {
	const d = 50 * time.Millisecond
	r := simulate(t, "testdata/flip.yaml", nil, Options{Modes: []cluster.Mode{"nftables"}, SyncTime: func(cluster.Mode, int, bool) time.Duration { return d }})
	m := r.Modes[0]
	for k, sw := range m.Flapping.Steps {
		want := d.Seconds()
		if k == 4 || k == 5 {
			want = (1100*time.Millisecond + d + time.Second + d - 1200*time.Millisecond).Seconds()
		}
		if math.Abs(sw.WindowMaxSeconds-want) > 1e-9 {
			t.Errorf("step %d: window %g s, want %g s", k+1, sw.WindowMaxSeconds, want)
		}
	}
	// On node-a, stale rules decide [1.0, 1.05), [1.1, 1.15), [1.2, 2.2)
	// and [5.0, 5.05): 1150 connections. Misrouted are those of the
	// not-ready windows, [1.0, 1.05) and [1.2, 2.2); in the other two the
	// stale rules reject an endpoint that is ready again (refused).
	if one := unit(t, r, "nftables", "flapping:demo/one:http"); one.Misrouted != 1050 || one.InWindow != 1150 {
		t.Errorf("demo/one: %d in window, %d misrouted; want 1150 and 1050", one.InWindow, one.Misrouted)
	}
	if m.Flapping.Refused != 100 {
		t.Errorf("refused %d, want 100 (node-a: 50 in [1.1 s, 1.15 s) and 50 in [5.0 s, 5.05 s))", m.Flapping.Refused)
	}
}

// TestDeterministic: the same seed gives the same report.json bytes; a
// different seed does not.
func TestDeterministic(t *testing.T) {
	var out [2]bytes.Buffer
	for i := range out {
		r := simulate(t, "testdata/medium.yaml", nil, Options{})
		if err := r.WriteJSON(&out[i]); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(out[0].Bytes(), out[1].Bytes()) {
		t.Fatal("two runs with the same seed wrote different report.json")
	}
	seed := uint64(12345)
	var other bytes.Buffer
	if err := simulate(t, "testdata/medium.yaml", &seed, Options{}).WriteJSON(&other); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(out[0].Bytes(), other.Bytes()) {
		t.Error("a different seed wrote the same report.json")
	}
}

// TestModeAlone: a mode simulated alone gives exactly its part of the run
// of all modes (the traffic does not depend on which modes run).
func TestModeAlone(t *testing.T) {
	all := simulate(t, "testdata/medium.yaml", nil, Options{})
	alone := simulate(t, "testdata/medium.yaml", nil, Options{Modes: []cluster.Mode{"nftables"}})
	if !bytes.Equal(encode(t, all.Modes[1]), encode(t, alone.Modes[0])) {
		t.Error("nftables alone differs from nftables among all modes")
	}
}

// TestMediumChecks: a correct engine passes every check of a scenario
// with every kind of event, in every mode, and no service port's
// distribution fails.
func TestMediumChecks(t *testing.T) {
	r := simulate(t, "testdata/medium.yaml", nil, Options{})
	if len(r.Failed) > 0 {
		for _, c := range r.Checks {
			if c.Verdict != report.Pass {
				t.Errorf("%s %s: %s %s %+v", c.Mode, c.Name, c.Verdict, c.Message, c.Units)
			}
		}
	}
	for _, m := range r.Modes {
		if sc := m.SelfCheck; sc.ServicePorts == 0 || sc.Rejected > 0 || sc.Verdict != report.Pass {
			t.Errorf("%s: engine self-check %s, %d service ports checked, %d rejected (%v): %v", m.Mode, sc.Verdict, sc.ServicePorts, sc.Rejected, sc.RejectedServicePorts, sc.Findings)
		}
		if m.Flapping.MismatchedAfterSync != 0 {
			t.Errorf("%s: %d mismatched after sync", m.Mode, m.Flapping.MismatchedAfterSync)
		}
		if m.Flapping.Misrouted == 0 {
			t.Errorf("%s: no connection misrouted in any exposure window", m.Mode)
		}
		if m.Affinity.Bound == 0 || m.Affinity.Stickiness != 1 {
			t.Errorf("%s: affinity %+v", m.Mode, m.Affinity)
		}
		if m.Connections.Total != 300000 {
			t.Errorf("%s: %d connections", m.Mode, m.Connections.Total)
		}
	}
}

// TestBrokenCheckFails: a check that cannot hold is reported failed.
func TestBrokenCheckFails(t *testing.T) {
	r := simulate(t, "testdata/broken.yaml", nil, Options{Modes: []cluster.Mode{"iptables"}})
	if len(r.Failed) != 1 || r.Failed[0] != "iptables/no-endpoints:demo/two:http" {
		t.Fatalf("failed %v, want the no-endpoints check only", r.Failed)
	}
}

func TestAlias(t *testing.T) {
	w := []float64{1, 2, 3, 4, 0, 10}
	a := newAlias(w)
	r := rand.NewPCG(1, 2)
	obs := make([]float64, len(w))
	for range 1_000_000 {
		obs[a.pick(r.Uint64())]++
	}
	res, err := stats.ChiSquareGOF(obs, []float64{1. / 20, 2. / 20, 3. / 20, 4. / 20, 0, 10. / 20})
	if err != nil {
		t.Fatal(err)
	}
	if res.P < 0.001 || len(res.Impossible) > 0 {
		t.Errorf("alias table: %s", res.Table())
	}
}

// TestRunReleasesModel checks that Run lets go of the cluster model once
// its timeline is captured (the clientset's and the informers' copies of
// every object are most of the loading's memory at 30,000 Services), and
// that closing the released model is harmless.
func TestRunReleasesModel(t *testing.T) {
	m, err := apiserver.Open(context.Background(), "testdata/flip.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(context.Background(), m, Options{}); err != nil {
		t.Fatal(err)
	}
	if m.Cluster != nil || m.Tracker != nil || m.State != nil {
		t.Errorf("after Run: cluster %v, tracker %v, state %v; want all released", m.Cluster != nil, m.Tracker != nil, m.State != nil)
	}
	if m.Loaded == nil || m.Expanded == nil {
		t.Errorf("after Run: the loaded scenario and its expansion are gone")
	}
	m.Close()
}

// TestIdleNodesSendNothing: a node with no client of its own sends no
// connection, whichever node its worker simulated before (the worker's
// chunk buffers once handed a node without connections the previous
// node's: with one worker, flip.yaml over four nodes counted 40,000
// connections for its 20,000).
func TestIdleNodesSendNothing(t *testing.T) {
	data, err := os.ReadFile("testdata/flip.yaml")
	if err != nil {
		t.Fatal(err)
	}
	four := strings.Replace(string(data), "    - name: node-b\n", "    - name: node-b\n    - name: node-c\n    - name: node-d\n", 1)
	file := filepath.Join(t.TempDir(), "flip4.yaml")
	if err := os.WriteFile(file, []byte(four), 0o644); err != nil {
		t.Fatal(err)
	}
	r := simulate(t, file, nil, Options{Workers: 1, SyncTime: func(cluster.Mode, int, bool) time.Duration { return 0 }})
	for _, m := range r.Modes {
		if m.Connections.Total != 20000 {
			t.Errorf("%s: %d connections, want 20000 (two client nodes; node-c and node-d have none)", m.Mode, m.Connections.Total)
		}
	}
}
