package capacity

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
	"github.com/kpsim/kpsim/sim/scenario"
)

const small = "testdata/small.yaml"

func load(t *testing.T) *scenario.Loaded {
	t.Helper()
	l, err := scenario.LoadFile(small)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func sweep(t *testing.T, o Options) *Result {
	t.Helper()
	if o.Calibrations == nil {
		o.Calibrations = append(cost.Defaults(), cost.Calibration{Mode: cluster.ModeIPVS, Variant: "netlink", Source: "test",
			Points: []cost.Point{{Services: 1000, EndpointsPerService: 10, Objects: cost.SyntheticObjects(cluster.ModeIPVS, 1000, 10), FullSeconds: 0.5}}})
	}
	res, err := Run(context.Background(), load(t), o)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestScalingKeepsShape: at every size the endpoints per service port and
// the policy fractions stay the scenario's, and nodes follow --nodes.
func TestScalingKeepsShape(t *testing.T) {
	const (
		fracTol = 0.02 // the generator picks exact counts; rounding only
		meanTol = 0.15 // relative: a Zipf(1.1) mean over >= 400 draws
	)
	for _, nodes := range []string{NodesScaled, NodesFixed} {
		res := sweep(t, Options{Sizes: []int{400, 1000, 2000}, Nodes: nodes})
		b := res.Base
		if b.Services != 200 || b.Nodes != 6 || b.MeanEndpoints < 2 {
			t.Fatalf("base shape %+v", b)
		}
		for _, sz := range res.Sizes {
			sh := sz.Shape
			if sh.ServicePorts != sz.Services {
				t.Errorf("%s %d: %d service ports, want %d", nodes, sz.Services, sh.ServicePorts, sz.Services)
			}
			if d := math.Abs(sh.MeanEndpoints-b.MeanEndpoints) / b.MeanEndpoints; d > meanTol {
				t.Errorf("%s %d: mean endpoints %.2f, base %.2f (%.0f %% off)", nodes, sz.Services, sh.MeanEndpoints, b.MeanEndpoints, 100*d)
			}
			for _, f := range []struct {
				name      string
				got, want float64
			}{{"affinity", sh.Affinity, b.Affinity}, {"internal Local", sh.InternalLocal, b.InternalLocal}, {"external Local", sh.ExternalLocal, b.ExternalLocal}} {
				if math.Abs(f.got-f.want) > fracTol {
					t.Errorf("%s %d: %s fraction %.3f, base %.3f", nodes, sz.Services, f.name, f.got, f.want)
				}
			}
			wantNodes := 6
			if nodes == NodesScaled {
				wantNodes = 6 * sz.Services / 200
			}
			if sh.Nodes != wantNodes {
				t.Errorf("%s %d: %d nodes, want %d", nodes, sz.Services, sh.Nodes, wantNodes)
			}
			if want := res.EventRate * float64(sz.Services) / 200; math.Abs(sz.EventRate-want) > 1e-12 {
				t.Errorf("%s %d: event rate %g, want %g", nodes, sz.Services, sz.EventRate, want)
			}
		}
	}
}

// TestExtrapolatedMarked: a row whose node lies outside its calibration's
// measured objects is marked, in the Estimate and in every text format.
func TestExtrapolatedMarked(t *testing.T) {
	res := sweep(t, Options{Sizes: []int{100, 1000, 8000}})
	var table, md bytes.Buffer
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if err := res.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	marked := 0
	for _, sz := range res.Sizes {
		for vi, r := range sz.Rows {
			m := res.Models[vi]
			outside := r.Objects > m.MaxObjects || r.Objects < m.MinObjects
			if outside != r.FullSync.Extrapolated || outside != r.PartialSync.Extrapolated {
				t.Errorf("%d %s: %d objects, measured %d-%d, extrapolated full %t partial %t", sz.Services, r.Variant, r.Objects, m.MinObjects, m.MaxObjects, r.FullSync.Extrapolated, r.PartialSync.Extrapolated)
			}
			if r.Latency != nil && r.Latency.Extrapolated != outside {
				t.Errorf("%d %s: latency extrapolated %t, want %t", sz.Services, r.Variant, r.Latency.Extrapolated, outside)
			}
			if outside {
				marked++
			}
		}
	}
	if marked == 0 {
		t.Fatal("no row is outside the measured range: the test shows nothing")
	}
	for name, text := range map[string]string{"table": table.String(), "markdown": md.String()} {
		for _, line := range strings.Split(text, "\n") {
			f := strings.Fields(line)
			if len(f) < 3 || (f[0] != "8000" && f[0] != "|") {
				continue
			}
			if strings.Contains(line, "8000") && !strings.Contains(line, "extrapolated") {
				t.Errorf("%s: a row at 8000 Services (beyond every calibration) is not marked: %s", name, line)
			}
		}
	}
}

// TestDeterministic: the same seed gives the same sweep, another seed
// another one.
func TestDeterministic(t *testing.T) {
	js := func(seed uint64) string {
		res := sweep(t, Options{Sizes: []int{200, 600}, Seed: &seed})
		var b bytes.Buffer
		if err := res.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	a, b, c := js(7), js(7), js(8)
	if a != b {
		t.Error("two sweeps with seed 7 differ")
	}
	if a == c {
		t.Error("seeds 7 and 8 give the same sweep: the seed is not used")
	}
}

// TestPerfDataParses: the PerfData JSON reads back into ClusterLoader2's
// shape with the expected labels and fields.
func TestPerfDataParses(t *testing.T) {
	res := sweep(t, Options{Sizes: []int{200, 1000}})
	var b bytes.Buffer
	if err := res.WritePerfData(&b); err != nil {
		t.Fatal(err)
	}
	var pd struct {
		Version   string `json:"version"`
		DataItems []struct {
			Data   map[string]float64 `json:"data"`
			Unit   string             `json:"unit"`
			Labels map[string]string  `json:"labels"`
		} `json:"dataItems"`
	}
	if err := json.Unmarshal(b.Bytes(), &pd); err != nil {
		t.Fatal(err)
	}
	if pd.Version != "v1" {
		t.Errorf("version %q", pd.Version)
	}
	latency := 0
	for _, it := range pd.DataItems {
		for _, k := range []string{"Metric", "Mode", "Variant", "Services", "Extrapolated"} {
			if it.Labels[k] == "" {
				t.Errorf("item %v has no label %s", it.Labels, k)
			}
		}
		if it.Labels["Metric"] == "NetworkProgrammingLatency" {
			latency++
			p50, ok50 := it.Data["Perc50"]
			p99, ok99 := it.Data["Perc99"]
			if !ok50 || !ok99 || it.Unit != "ms" || p99 < p50 || p50 <= 0 {
				t.Errorf("latency item %+v", it)
			}
		}
	}
	if want := 2 * len(res.Models); latency != want {
		t.Errorf("%d latency items, want %d", latency, want)
	}
}

// TestNoGenerateIsBadInput: a scenario without a generate section cannot be
// scaled; the error names the file.
func TestNoGenerateIsBadInput(t *testing.T) {
	l, err := scenario.LoadFile("../../scenarios/conformance/distribution.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), l, Options{Sizes: []int{100}})
	if !scenario.IsInvalid(err) || !strings.Contains(err.Error(), "distribution.yaml") {
		t.Errorf("got %v, want a scenario error naming the file", err)
	}
}

// TestBandsHoldEstimates: every band a sweep prints holds its estimate
// (sync times, and the programming-latency p99, whose runs at the band's
// ends need not bracket it).
func TestBandsHoldEstimates(t *testing.T) {
	cals, err := cost.LoadCalibrations("../../results/calibration")
	if err != nil {
		t.Fatal(err)
	}
	l, err := scenario.LoadFile("../../results/capacity/scenarios/clusterip-10.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), l, Options{Sizes: []int{100, 1000, 5000}, Calibrations: cals})
	if err != nil {
		t.Fatal(err)
	}
	for _, sz := range res.Sizes {
		for _, r := range sz.Rows {
			for name, e := range map[string]cost.Estimate{"full": r.FullSync, "partial": r.PartialSync} {
				if !(e.Low <= e.Seconds && e.Seconds <= e.High) {
					t.Errorf("%d %s %s sync: %g outside its band %g-%g", sz.Services, r.Variant, name, e.Seconds, e.Low, e.High)
				}
			}
			if l := r.Latency; l != nil && !(l.P99Low <= l.P99 && l.P99 <= l.P99High) {
				t.Errorf("%d %s: programming latency p99 %g outside its band %g-%g", sz.Services, r.Variant, l.P99, l.P99Low, l.P99High)
			}
		}
	}
}

// TestExternalCarried: the sweep counts the scenario's NodePort Services'
// external objects (IPVS: one more virtual server per node port, the
// node's one address) and gives their first packets' walk, which in
// iptables mode comes after every cluster IP rule of KUBE-SERVICES.
func TestExternalCarried(t *testing.T) {
	res := sweep(t, Options{Sizes: []int{200, 1000}})
	for _, sz := range res.Sizes {
		st, _, err := stateOf(mustScaled(t, sz.Services), nil)
		if err != nil {
			t.Fatal(err)
		}
		nodePorts := 0
		for _, sp := range st.Services {
			if sp.NodePort != 0 {
				nodePorts++
			}
		}
		if nodePorts == 0 {
			t.Fatalf("%d Services: no node port to test", sz.Services)
		}
		for _, r := range sz.Rows {
			fp := r.FirstPacket
			if r.Mode == cluster.ModeIPVS && r.Counts.VirtualServers != sz.Shape.ServicePorts+nodePorts {
				t.Errorf("%d Services, %s: %d virtual servers, want %d cluster IPs and %d node ports", sz.Services, r.Variant, r.Counts.VirtualServers, sz.Shape.ServicePorts, nodePorts)
			}
			if fp.NodePort == nil || fp.ClusterIP == nil {
				t.Errorf("%d Services, %s: no node-port or cluster-IP walk: %+v", sz.Services, r.Variant, fp)
				continue
			}
			// Every cluster IP with endpoints on the node has its rule in
			// KUBE-SERVICES: at least the ports without internalTrafficPolicy
			// Local (10 %) or not-ready endpoints (2 %).
			if min := 0.85 * float64(sz.Shape.ServicePorts); r.Mode == cluster.ModeIPTables && (fp.NodePort.RulesP50 < min || fp.NodePort.RulesP50 <= fp.ClusterIP.RulesP50) {
				t.Errorf("%d Services, %s: node port p50 %v, cluster IP p50 %v: a node port walks all of KUBE-SERVICES first (> %v rules)", sz.Services, r.Variant, fp.NodePort.RulesP50, fp.ClusterIP.RulesP50, min)
			}
		}
	}
	var items int
	for _, d := range res.PerfData().DataItems {
		if d.Labels["Metric"] == "FirstPacketRulesNodePort" {
			items++
		}
	}
	if want := 2 * len(res.Models); items != want {
		t.Errorf("%d FirstPacketRulesNodePort items, want %d", items, want)
	}
}

func mustScaled(t *testing.T, n int) *scenario.Loaded {
	t.Helper()
	l := load(t)
	sl, _, err := scaled(l, shapeOfLoaded(t, l), n, NodesScaled)
	if err != nil {
		t.Fatal(err)
	}
	return sl
}

func shapeOfLoaded(t *testing.T, l *scenario.Loaded) Shape {
	t.Helper()
	st, _, err := stateOf(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	return shapeOf(l.Scenario.Generate.Services, st)
}
