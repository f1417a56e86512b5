package calibrate

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
)

func ref(points ...[2]float64) *Calibration {
	c := &Calibration{Mode: cluster.ModeIPTables, Variant: "legacy"}
	for _, p := range points {
		c.Points = append(c.Points, Point{Services: int(p[0]), EndpointsPerService: 10, FullSeconds: p[1], Runs: 3})
	}
	return c
}

func TestEmulationRatio(t *testing.T) {
	vm := ref([2]float64{100, 1.0}, [2]float64{500, 6.0}, [2]float64{1000, 10.0}, [2]float64{2000, 99})
	host := ref([2]float64{100, 0.1}, [2]float64{500, 0.5}, [2]float64{1000, 1.25}, [2]float64{3000, 1})
	e, rs, err := EmulationRatio(vm, host, "tcg")
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 {
		t.Fatalf("%d sizes compared, want the 3 in common: %+v", len(rs), rs)
	}
	// Ratios 10, 12, 8: median 10, range 8-12.
	if e.Ratio != 10 || e.Low != 8 || e.High != 12 {
		t.Errorf("ratio %v (%v-%v), want 10 (8-12)", e.Ratio, e.Low, e.High)
	}
	want := []cost.EmulationSize{{Services: 100, Ratio: 10}, {Services: 500, Ratio: 12}, {Services: 1000, Ratio: 8}}
	if !reflect.DeepEqual(e.Sizes, want) {
		t.Errorf("sizes %+v, want %+v", e.Sizes, want)
	}
	for _, want := range []string{"tcg", "500 x 10: 12.00", "medians of 3 runs"} {
		if !strings.Contains(e.Method, want) {
			t.Errorf("method %q does not say %q", e.Method, want)
		}
	}
}

func TestEmulationRatioErrors(t *testing.T) {
	other := ref([2]float64{100, 1})
	other.Variant = "nft"
	for name, c := range map[string][2]*Calibration{
		"variants differ": {ref([2]float64{100, 1}), other},
		"no common size":  {ref([2]float64{100, 1}), ref([2]float64{200, 1})},
		"zero time":       {ref([2]float64{100, 0}), ref([2]float64{100, 1})},
	} {
		if _, _, err := EmulationRatio(c[0], c[1], "tcg"); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// The file sim calibrate writes reads back as the cost model's
// calibration, emulation included.
func TestCalibrationJSONRoundTrip(t *testing.T) {
	in := []*Calibration{{Mode: cluster.ModeIPVS, Variant: "netlink", Machine: "qemu microVM, tcg", Source: "sim calibrate --mode ipvs",
		Emulation: &cost.Emulation{Ratio: 9.5, Low: 8, High: 11, Method: "m", Sizes: []cost.EmulationSize{{Services: 100, Ratio: 8}, {Services: 300, Ratio: 11}}},
		Points:    []Point{{Services: 100, EndpointsPerService: 10, Objects: 2200, FullSeconds: 1.5, PartialSeconds: 0.7, IncrementalSeconds: 0.01, Runs: 3}}}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out []cost.Calibration
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].Emulation == nil || !reflect.DeepEqual(out[0].Emulation, in[0].Emulation) {
		t.Fatalf("emulation lost in the round trip: %s", b)
	}
	if p := out[0].Points[0]; p.FullSeconds != 1.5 || p.PartialSeconds != 0.7 || p.Services != 100 || out[0].Mode != cluster.ModeIPVS {
		t.Errorf("points changed in the round trip: %+v", out[0])
	}
	var back []*Calibration
	if err := json.Unmarshal(b, &back); err != nil || back[0].Points[0].IncrementalSeconds != 0.01 || back[0].Machine != in[0].Machine {
		t.Errorf("calibrate's own reading lost fields (%v): %s", err, b)
	}
}
