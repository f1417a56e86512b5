package cost

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/kpsim/kpsim/sim/cluster"
)

// synthetic builds a calibration whose full sync times follow f exactly
// (times a deterministic relative wobble, +-noise alternating).
func synthetic(mode cluster.Mode, variant string, sizes []int, noise float64, f func(Counts) float64) Calibration {
	c := Calibration{Mode: mode, Variant: variant, Source: "test"}
	for i, n := range sizes {
		y := f(SyntheticCounts(mode, n, 10))
		if i%2 == 0 {
			y *= 1 + noise
		} else {
			y *= 1 - noise
		}
		c.Points = append(c.Points, Point{Services: n, EndpointsPerService: 10, FullSeconds: y, PartialSeconds: y / 10})
	}
	return c
}

var ladder = []int{100, 250, 500, 1000, 2000, 5000}

func TestFitRecoversLinear(t *testing.T) {
	const a, b = 0.05, 6e-6
	c := synthetic(cluster.ModeIPTables, "legacy", ladder, 0, func(c Counts) float64 { return a + b*float64(c.Objects) })
	m, err := NewModel(c)
	if err != nil {
		t.Fatal(err)
	}
	// Exact points: the fit is exact up to rounding.
	if math.Abs(m.Params[0]-a)/a > 1e-6 || math.Abs(m.Params[1]-b)/b > 1e-6 || m.FitError > 1e-9 {
		t.Errorf("params %v fit error %g, want [%g %g] and 0", m.Params, m.FitError, a, b)
	}
}

// TestCappedBeyondRange: past the largest measured point a power term
// whose k exceeds its count's exponent continues at that point's cost per
// step (the count's exponent), and the band still reaches the fitted
// curve; inside the range nothing changes.
func TestCappedBeyondRange(t *testing.T) {
	const a, b, cc, k = 0.02, 3e-6, 1e-12, 1.6
	f := noflushTruth(a, b, cc, k)
	m := mustModel(t, synthetic(cluster.ModeIPTables, "nft", ladder, 0, f))
	last := SyntheticCounts(cluster.ModeIPTables, ladder[len(ladder)-1], 10)
	if e := m.Full(last); math.Abs(e.Seconds-f(last))/f(last) > 0.01 {
		t.Errorf("at the largest point: %v, want the fit's %g", e, f(last))
	}
	far := SyntheticCounts(cluster.ModeIPTables, 30000, 10)
	w, w0 := float64(far.Objects)*float64(far.Chains), float64(last.Objects)*float64(last.Chains)
	want := a + b*float64(far.Objects) + cc*math.Pow(w0, k)*(w/w0)
	e := m.Full(far)
	if math.Abs(e.Seconds-want)/want > 0.02 {
		t.Errorf("30,000 Services: %v, want the cost per compare of the largest point, %g s", e, want)
	}
	if !(e.High >= f(far)) || !e.Extrapolated {
		t.Errorf("30,000 Services: band %v does not reach the fitted curve's %g s", e, f(far))
	}
	if !strings.Contains(m.Note, "held") {
		t.Errorf("note %q does not say the cost per step is held", m.Note)
	}
}

// TestExtrapolatedByShape: a node of more Services with fewer endpoints
// can hold fewer objects than the largest calibration point and still lie
// past it in the kernel's set walks (quadratic in Services): it is marked
// extrapolated, by the walks' ratio in Services.
func TestExtrapolatedByShape(t *testing.T) {
	m := mustModel(t, synthetic(cluster.ModeNFTables, "kube-proxy", ladder, 0, func(c Counts) float64 {
		return 0.01 + 1e-5*float64(c.Objects) + 3e-9*math.Pow(fSetWalks.of(c), 1.1)
	}))
	at := SyntheticCounts(cluster.ModeNFTables, 7000, 2)
	if at.Objects >= m.MaxObjects {
		t.Fatalf("7,000 x 2 has %d objects, want fewer than the largest point's %d", at.Objects, m.MaxObjects)
	}
	e := m.Full(at)
	want := math.Sqrt(fSetWalks.of(at) / fSetWalks.of(SyntheticCounts(cluster.ModeNFTables, 5000, 10)))
	if !e.Extrapolated || math.Abs(e.Factor-want) > 0.01 {
		t.Errorf("7,000 x 2: %v (factor %g), want extrapolated by %g in Services", e, e.Factor, want)
	}
	if p := m.Partial(at); !p.Extrapolated {
		t.Errorf("its partial sync %v is not marked extrapolated", p)
	}
	if e := m.Full(SyntheticCounts(cluster.ModeNFTables, 4000, 2)); e.Extrapolated {
		t.Errorf("4,000 x 2 is inside both ranges: %v", e)
	}
}

func mustModel(t *testing.T, c Calibration) Model {
	t.Helper()
	m, err := NewModel(c)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// noflushTruth is the iptables-nft form with known parameters.
func noflushTruth(a, b, cc, k float64) func(Counts) float64 {
	return func(c Counts) float64 {
		return a + b*float64(c.Objects) + cc*math.Pow(float64(c.Objects)*float64(c.Chains), k)
	}
}

func TestFitRecoversNoflushExponent(t *testing.T) {
	const a, b, cc, k = 0.02, 3e-6, 1e-9, 1.15
	f := noflushTruth(a, b, cc, k)
	exact, err := NewModel(synthetic(cluster.ModeIPTables, "nft", ladder, 0, f))
	if err != nil {
		t.Fatal(err)
	}
	// Tolerance: k is scanned in steps of 0.01, so k within 0.01 and the
	// coefficients within 10 % (b and c trade against each other slightly
	// off the true k).
	p := exact.Params
	if math.Abs(p[3]-k) > 0.011 || math.Abs(p[2]-cc)/cc > 0.1 || math.Abs(p[1]-b)/b > 0.1 {
		t.Errorf("exact points: params %v, want [%g %g %g %g]", p, a, b, cc, k)
	}
	// 3 % alternating noise: k within 0.1, and the band holds the truth
	// at 30,000 Services (6x the largest point).
	noisy, err := NewModel(synthetic(cluster.ModeIPTables, "nft", ladder, 0.03, f))
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(noisy.Params[3]-k) > 0.1 {
		t.Errorf("3 %% noise: k %g, want %g +- 0.1", noisy.Params[3], k)
	}
	far := SyntheticCounts(cluster.ModeIPTables, 30000, 10)
	if e := noisy.Full(far); !(e.Low <= f(far) && f(far) <= e.High) || !e.Extrapolated {
		t.Errorf("30,000 Services: %v, true %g", e, f(far))
	}
	if !strings.Contains(noisy.Fitted, "fitted") {
		t.Errorf("Fitted %q does not say k was fitted", noisy.Fitted)
	}
	// Four points cannot tell k from the coefficients: fixed at 1, the
	// strcmp count's.
	few, err := NewModel(synthetic(cluster.ModeIPTables, "nft", ladder[:4], 0, f))
	if err != nil {
		t.Fatal(err)
	}
	if few.Params[3] != 1 || !strings.Contains(few.Fitted, "fixed") {
		t.Errorf("4 points: params %v %q, want k fixed at 1", few.Params, few.Fitted)
	}
}

func TestFitNonNegative(t *testing.T) {
	// Times that fall with size would want a negative slope.
	c := Calibration{Mode: cluster.ModeNFTables, Variant: "fast", Source: "test"}
	for i, n := range ladder {
		c.Points = append(c.Points, Point{Services: n, EndpointsPerService: 10, FullSeconds: 1 - 0.1*float64(i)})
	}
	m, err := NewModel(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Params {
		if p < 0 {
			t.Errorf("negative coefficient in %v", m.Params)
		}
	}
}

func TestExtrapolationMarkedAndBandWidens(t *testing.T) {
	c := synthetic(cluster.ModeNFTables, "kube-proxy", ladder, 0.05, func(c Counts) float64 { return 0.1 + 1.5e-4*float64(c.Objects) })
	m, err := NewModel(c)
	if err != nil {
		t.Fatal(err)
	}
	in := m.Full(SyntheticCounts(cluster.ModeNFTables, 2000, 10))
	edge := m.Full(SyntheticCounts(cluster.ModeNFTables, 5000, 10))
	out := m.Full(SyntheticCounts(cluster.ModeNFTables, 30000, 10))
	below := m.Full(SyntheticCounts(cluster.ModeNFTables, 50, 10))
	if in.Extrapolated || edge.Extrapolated || !out.Extrapolated || !below.Extrapolated {
		t.Fatalf("marks: 2000 %v, 5000 %v, 30000 %v, 50 %v", in, edge, out, below)
	}
	wantF := float64(SyntheticObjects(cluster.ModeNFTables, 30000, 10)) / float64(SyntheticObjects(cluster.ModeNFTables, 5000, 10))
	if math.Abs(out.Factor-wantF) > 1e-9 || below.Factor >= 1 {
		t.Errorf("factors %g (want %g), %g (want < 1)", out.Factor, wantF, below.Factor)
	}
	if s := out.String(); !strings.Contains(s, "extrapolated") || !strings.Contains(s, "largest measured size") {
		t.Errorf("String %q", s)
	}
	rel := func(e Estimate) float64 { return e.High/e.Seconds - 1 }
	if !(rel(out) > rel(edge)) {
		t.Errorf("band does not widen outside the range: %g at 5000, %g at 30000", rel(edge), rel(out))
	}
	for _, e := range []Estimate{in, edge, out} {
		if rel(e) < m.FitError || e.Seconds/e.Low-1 < m.FitError {
			t.Errorf("band %v narrower than the fit error %g", e, m.FitError)
		}
	}
}

func TestEmulationDividedAndWidened(t *testing.T) {
	c := synthetic(cluster.ModeIPVS, "netlink", ladder, 0.02, func(c Counts) float64 {
		return 8 * (0.01 + 2e-5*float64(c.VirtualServers) + 5e-6*float64(c.RealServers))
	})
	host, err := NewModel(c)
	if err != nil {
		t.Fatal(err)
	}
	c.Emulation = &Emulation{Ratio: 8, Low: 6, High: 10, Method: "test"}
	vm, err := NewModel(c)
	if err != nil {
		t.Fatal(err)
	}
	at := SyntheticCounts(cluster.ModeIPVS, 1000, 10)
	h, v := host.Full(at), vm.Full(at)
	if math.Abs(v.Seconds*8-h.Seconds)/h.Seconds > 1e-9 {
		t.Errorf("emulated %g s x 8 != host-scale %g s", v.Seconds, h.Seconds)
	}
	if !(v.High/v.Seconds > h.High/h.Seconds) || !(v.Seconds/v.Low > h.Seconds/h.Low) {
		t.Errorf("emulation band %v not wider than %v", v, h)
	}
	// IPVS's steady-state sync (the resync points, a tenth of the full
	// ones in synthetic) has its own fit.
	if p := vm.Partial(at); !(p.Seconds < v.Seconds/5) {
		t.Errorf("ipvs partial %v, want the resync fit, about a tenth of full %v", p, v)
	}
}

// TestEmulationPerSize: with per-size ratios, each point is divided by the
// ratio at its own size, so VM times that are the host's times the
// size's ratio fit exactly what the host would have measured.
func TestEmulationPerSize(t *testing.T) {
	hostTime := func(c Counts) float64 { return 0.01 + 2e-5*float64(c.VirtualServers) + 5e-6*float64(c.RealServers) }
	host, err := NewModel(synthetic(cluster.ModeIPVS, "netlink", ladder, 0, hostTime))
	if err != nil {
		t.Fatal(err)
	}
	e := &Emulation{Ratio: 15, Low: 10, High: 20, Method: "test",
		Sizes: []EmulationSize{{Services: 100, Ratio: 20}, {Services: 1000, Ratio: 15}, {Services: 2000, Ratio: 10}}}
	for _, tc := range []struct {
		services int
		want     float64
	}{{50, 20}, {100, 20}, {1000, 15}, {2000, 10}, {5000, 10}, {316, 17.5}} {
		if got := e.At(tc.services); math.Abs(got-tc.want) > 0.01 {
			t.Errorf("At(%d) = %g, want %g (log interpolation, nearest size outside)", tc.services, got, tc.want)
		}
	}
	c := synthetic(cluster.ModeIPVS, "netlink", ladder, 0, hostTime)
	for i := range c.Points {
		c.Points[i].FullSeconds *= e.At(c.Points[i].Services)
	}
	c.Emulation = e
	vm, err := NewModel(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{100, 1000, 5000, 20000} {
		at := SyntheticCounts(cluster.ModeIPVS, n, 10)
		if h, v := host.Full(at).Seconds, vm.Full(at).Seconds; math.Abs(v-h)/h > 1e-6 {
			t.Errorf("%d Services: per-size emulation gives %g s, the host's own fit %g s", n, v, h)
		}
	}
	if vm.FitError > 1e-9 {
		t.Errorf("fit error %g: the per-size division should leave the host's exact form", vm.FitError)
	}
	// Out of order or outside the range: refused.
	bad := *e
	bad.Sizes = []EmulationSize{{Services: 1000, Ratio: 15}, {Services: 100, Ratio: 20}}
	c.Emulation = &bad
	if _, err := NewModel(c); err == nil {
		t.Error("sizes out of order: no error")
	}
	bad.Sizes = []EmulationSize{{Services: 100, Ratio: 30}}
	if _, err := NewModel(c); err == nil {
		t.Error("a size's ratio outside low-high: no error")
	}
}

// TestLeaveOneOut holds out each committed calibration point in turn, fits
// the rest, and checks that the band at the held-out size contains the
// measured time. The band is a 95 % interval and the committed points were
// measured on a shared machine (one nftables point is off its neighbours
// by 2x), so a miss is logged, and the test fails when the number of
// misses is improbable (under 1 %) for a band that covers 95 %.
func TestLeaveOneOut(t *testing.T) {
	cs, err := LoadCalibrations("../../results/calibration")
	if err != nil {
		t.Fatal(err)
	}
	n, miss := 0, 0
	for _, c := range cs {
		if strings.HasPrefix(c.Source, "not in ") || len(c.Points) < 4 {
			continue // a default, or too few points to leave one out
		}
		for i, p := range c.Points {
			rest := c
			rest.Points = append(append([]Point{}, c.Points[:i]...), c.Points[i+1:]...)
			m, err := NewModel(rest)
			if err != nil {
				t.Fatal(err)
			}
			e := m.Full(pointCounts(c.Mode, p))
			// The model is in host seconds: a point measured under
			// emulation is compared as the model reads it.
			y := p.FullSeconds
			if c.Emulation != nil {
				y /= c.Emulation.At(p.Services)
			}
			if e.Low > y || y > e.High {
				t.Logf("miss: %s/%s without %d Services: %v (band %.3g-%.3g s), measured %.3g s (host seconds)", c.Mode, c.Variant, p.Services, e, e.Low, e.High, y)
				miss++
			}
			n++
		}
	}
	if n == 0 {
		t.Fatal("no committed calibration with 4 or more points")
	}
	// A 95 % band misses each held-out point with probability 0.05: fail
	// when this many misses would happen with probability under 1 %.
	tail := 1 - distuv.Binomial{N: float64(n), P: 0.05}.CDF(float64(miss)-1)
	if miss > 0 && tail < 0.01 {
		t.Errorf("%d of %d held-out points outside the band: P(>= %d misses | 95 %% coverage) = %.4f < 0.01", miss, n, miss, tail)
	}
}

func TestLoadCalibrationsStrict(t *testing.T) {
	dir := t.TempDir()
	var ce *CalibrationError
	if _, err := LoadCalibrations(filepath.Join(dir, "nope")); !errors.As(err, &ce) || !strings.Contains(err.Error(), "nope") {
		t.Errorf("missing folder: %v", err)
	}
	if _, err := LoadCalibrations(dir); !errors.As(err, &ce) || !strings.Contains(err.Error(), "holds no calibration") {
		t.Errorf("empty folder: %v", err)
	}
	write := func(name, text string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := write("iptables.json", "[\n {\"mode\": \"iptables\", \"variant\": \"legacy\",\n  \"points\": [{\"services\": \"many\"}]}\n]\n")
	if _, err := LoadCalibrations(dir); !errors.As(err, &ce) || ce.File != f || ce.Line != 3 || !strings.Contains(ce.Field, "services") {
		t.Errorf("wrong type: %v (%+v)", err, ce)
	}
	write("iptables.json", "[\n {\"mode\": \"iptables\", \"variant\": \"legacy\",\n  \"points\": [{\"services\": 100, \"endpointsPerService\": 10, \"fullSyncSeconds\": 0}]}\n]\n")
	if _, err := LoadCalibrations(dir); !errors.As(err, &ce) || ce.Line != 2 || ce.Field != "[0].points[0].fullSyncSeconds" {
		t.Errorf("zero time: %v (%+v)", err, ce)
	}
	write("iptables.json", "[\n {\"mode\": \"iptables\",,}]")
	if _, err := LoadCalibrations(dir); !errors.As(err, &ce) || ce.Line != 2 {
		t.Errorf("syntax: %v (%+v)", err, ce)
	}
	write("iptables.json", `[{"mode": "iptables", "variant": "legacy", "points": [{"services": 100, "endpointsPerService": 10, "fullSyncSeconds": 0.1}]}]`)
	cs, err := LoadCalibrations(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := Find(cs, cluster.ModeNFTables, "kube-proxy"); !ok || !strings.HasPrefix(c.Source, "not in "+dir) {
		t.Errorf("a mode the folder lacks: %+v %v, want the default marked as not in the folder", c, ok)
	}
}

func TestLoadCalibrationsMergesFiles(t *testing.T) {
	dir := t.TempDir()
	pt := func(n int, s float64) string {
		return fmt.Sprintf(`{"services": %d, "endpointsPerService": 10, "fullSyncSeconds": %g}`, n, s)
	}
	write := func(name string, pts ...string) {
		text := `[{"mode": "iptables", "variant": "nft", "source": "sim calibrate --mode iptables", "points": [` + strings.Join(pts, ",") + `]}]`
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.json", pt(100, 0.1), pt(1000, 2))
	write("b.json", pt(500, 1))
	cs, err := LoadCalibrations(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := Find(cs, cluster.ModeIPTables, "nft")
	if len(c.Points) != 3 || c.Points[1].Services != 500 {
		t.Errorf("merged points %+v, want 100, 500, 1000", c.Points)
	}
	write("b.json", pt(1000, 3))
	var ce *CalibrationError
	if _, err := LoadCalibrations(dir); !errors.As(err, &ce) || !strings.Contains(err.Error(), "measured in two files") {
		t.Errorf("a size in two files: %v", err)
	}
	// Two files of one emulated calibration must share their emulation:
	// each file's points are divided by its own references' ratios.
	emulated := func(name string, ratio float64, n int) {
		text := fmt.Sprintf(`[{"mode": "ipvs", "variant": "netlink", "emulation": {"ratio": %g, "low": %g, "high": %g, "method": "m"}, "points": [%s]}]`, ratio, ratio, ratio, pt(n, 1))
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("b.json", pt(500, 1))
	emulated("ipvs.json", 10, 100)
	emulated("ipvs-large.json", 10, 1000)
	if _, err := LoadCalibrations(dir); err != nil {
		t.Errorf("two files with the same emulation: %v", err)
	}
	emulated("ipvs-large.json", 12, 1000)
	if _, err := LoadCalibrations(dir); !errors.As(err, &ce) || !strings.Contains(err.Error(), "different emulation ratios") {
		t.Errorf("two files with different emulations: %v", err)
	}
}

// TestFactorString: a factor just past the measured range must not print
// as "1x", which reads as inside it.
func TestFactorString(t *testing.T) {
	for _, c := range []struct {
		f    float64
		want string
	}{{1.049, "1.05"}, {0.5, "0.50"}, {5.43, "5.4"}, {27.4, "27"}} {
		if got := FactorString(c.f); got != c.want {
			t.Errorf("FactorString(%g) = %q, want %q", c.f, got, c.want)
		}
	}
}
