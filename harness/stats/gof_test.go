package stats

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestChiSquareGOFKnownValues(t *testing.T) {
	// Expected [25 25 50]: X² = 1 + 1 + 0 = 2, and with df = 2 the survival is exp(-x/2).
	res, err := ChiSquareGOF([]float64{20, 30, 50}, []float64{0.25, 0.25, 0.5})
	if err != nil {
		t.Fatal(err)
	}
	checkRel(t, "statistic", res.Statistic, 2, 1e-14)
	if res.DF != 2 || res.N != 100 {
		t.Errorf("df, n = %d, %g; want 2, 100", res.DF, res.N)
	}
	checkRel(t, "p", res.P, math.Exp(-1), 1e-12)
	checkRel(t, "effect size", res.EffectSize, math.Sqrt(2.0/100), 1e-14)
	checkRel(t, "max abs deviation", res.MaxAbsDeviation, 0.05, 1e-12)
	if len(res.Cells) != 3 || res.Cells[2].Expected != 50 || len(res.Notes) != 0 {
		t.Errorf("cells %+v notes %v", res.Cells, res.Notes)
	}

	g, err := GTest([]float64{20, 30, 50}, []float64{0.25, 0.25, 0.5})
	if err != nil {
		t.Fatal(err)
	}
	wantG := 2 * (20*math.Log(20.0/25) + 30*math.Log(30.0/25))
	checkRel(t, "G", g.Statistic, wantG, 1e-12)
	checkRel(t, "G p", g.P, math.Exp(-wantG/2), 1e-12)
	checkRel(t, "G effect size (Pearson's w)", g.EffectSize, res.EffectSize, 1e-14)

	// Expected counts instead of probabilities give the same result.
	c, err := ChiSquareGOF([]float64{20, 30, 50}, []float64{25, 25, 50})
	if err != nil {
		t.Fatal(err)
	}
	if c.Statistic != res.Statistic || c.P != res.P {
		t.Errorf("counts gave %v/%v, probabilities %v/%v", c.Statistic, c.P, res.Statistic, res.P)
	}
	if !res.Rejects(0.4) || res.Rejects(0.3) {
		t.Errorf("Rejects at p = %v wrong", res.P)
	}
}

func TestChiSquareGOFMergesSmallCells(t *testing.T) {
	obs := []float64{38, 41, 12, 4, 0, 5}
	exp := []float64{0.4, 0.4, 0.1, 0.03, 0.02, 0.05} // counts 40 40 10 3 2 5
	res, err := ChiSquareGOF(obs, exp)
	if err != nil {
		t.Fatal(err)
	}
	var idx [][]int
	for _, c := range res.Cells {
		idx = append(idx, c.Index)
		if c.Expected < MinExpected {
			t.Errorf("cell %v has expected %g < %g", c.Index, c.Expected, MinExpected)
		}
	}
	want := [][]int{{0}, {1}, {2}, {3, 4}, {5}}
	if !slices.EqualFunc(idx, want, slices.Equal) {
		t.Errorf("cells %v, want %v", idx, want)
	}
	if res.DF != 4 {
		t.Errorf("df = %d, want 4", res.DF)
	}
	if len(res.Notes) != 1 || !strings.Contains(res.Notes[0], "merged cells [3 4]") {
		t.Errorf("notes %q", res.Notes)
	}
	m := res.Cells[3]
	if m.Observed != 4 || math.Abs(m.Expected-5) > 1e-12 {
		t.Errorf("merged cell %+v", m)
	}
	// The statistic is over the merged cells.
	want2 := 4/40.0 + 1/40.0 + 4/10.0 + 1/5.0 + 0
	checkRel(t, "statistic", res.Statistic, want2, 1e-12)
	// MaxAbsDeviation is over the original cells: |12/100 - 0.1| = 0.02.
	checkRel(t, "max abs deviation", res.MaxAbsDeviation, 0.02, 1e-12)
}

func TestChiSquareGOFImpossibleCell(t *testing.T) {
	// Traffic to a not-ready endpoint (probability 0).
	for _, f := range []func([]float64, []float64) (Result, error){ChiSquareGOF, GTest} {
		res, err := f([]float64{50, 45, 5}, []float64{0.5, 0.5, 0})
		if err != nil {
			t.Fatal(err)
		}
		if res.P != 0 || !slices.Equal(res.Impossible, []int{2}) {
			t.Errorf("%s: p = %v, impossible %v; want 0, [2]", res.Test, res.P, res.Impossible)
		}
		last := res.Cells[len(res.Cells)-1]
		if !slices.Equal(last.Index, []int{2}) || last.Observed != 5 || last.Expected != 0 {
			t.Errorf("%s: impossible cell missing from table: %+v", res.Test, res.Cells)
		}
		if _, err := json.Marshal(res); err != nil {
			t.Errorf("%s: result does not encode: %v", res.Test, err)
		}
	}
	// A zero-probability cell without observations is only left out.
	res, err := ChiSquareGOF([]float64{50, 50, 0}, []float64{0.5, 0.5, 0})
	if err != nil {
		t.Fatal(err)
	}
	if res.P != 1 || res.DF != 1 || len(res.Impossible) != 0 || len(res.Notes) != 1 {
		t.Errorf("got %+v", res)
	}
	// One possible endpoint: deterministic.
	res, err = ChiSquareGOF([]float64{100, 0}, []float64{1, 0})
	if err != nil || res.P != 1 || res.DF != 0 {
		t.Errorf("single cell: %+v, %v", res, err)
	}
	res, err = ChiSquareGOF([]float64{99, 1}, []float64{1, 0})
	if err != nil || res.P != 0 {
		t.Errorf("single cell with an impossible observation: %+v, %v", res, err)
	}
	// Too few observations to test, yet an impossible one still fails.
	res, err = ChiSquareGOF([]float64{1, 1, 1}, []float64{0.5, 0.5, 0})
	if err != nil || res.P != 0 {
		t.Errorf("few observations with an impossible one: %+v, %v", res, err)
	}
}

func TestChiSquareGOFErrors(t *testing.T) {
	cases := []struct {
		name     string
		obs, exp []float64
		tooFew   bool
	}{
		{"length mismatch", []float64{1, 2}, []float64{1}, false},
		{"no cells", nil, nil, false},
		{"negative count", []float64{-1, 5}, []float64{0.5, 0.5}, false},
		{"NaN expected", []float64{1, 5}, []float64{math.NaN(), 0.5}, false},
		{"probabilities sum to 0.9", []float64{50, 50}, []float64{0.5, 0.4}, false},
		{"counts do not sum to n", []float64{50, 50}, []float64{50, 51}, false},
		{"probabilities off by 1e-8", []float64{50, 50}, []float64{0.5, 0.5 + 1e-8}, false},
		{"no observations", []float64{0, 0}, []float64{0.5, 0.5}, true},
		{"too few after merging", []float64{1, 2}, []float64{0.5, 0.5}, true},
	}
	for _, c := range cases {
		_, err := ChiSquareGOF(c.obs, c.exp)
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		if c.tooFew != IsTooFewObservations(err) || c.tooFew == IsInvalidArgument(err) {
			t.Errorf("%s: wrong error class: %v", c.name, err)
		}
		if msg := err.Error(); msg[0] < 'a' || msg[0] > 'z' {
			t.Errorf("%s: error not lower-case: %q", c.name, msg)
		}
	}
	// Within 1e-9 of 1 is fine.
	if _, err := ChiSquareGOF([]float64{50, 50}, []float64{0.5, 0.5 + 5e-10}); err != nil {
		t.Errorf("sum 1+5e-10 rejected: %v", err)
	}
}

func TestResultJSON(t *testing.T) {
	res, err := ChiSquareGOF([]float64{38, 41, 12, 4, 0, 5}, []float64{0.4, 0.4, 0.1, 0.03, 0.02, 0.05})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"test"`, `"statistic"`, `"df"`, `"p"`, `"n"`, `"effect_size"`, `"max_abs_deviation"`, `"cells"`, `"notes"`, `"index"`, `"observed"`, `"expected"`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("JSON lacks %s: %s", key, b)
		}
	}
	var back Result
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.P != res.P || back.DF != res.DF || len(back.Cells) != len(res.Cells) {
		t.Errorf("round trip changed the result: %+v", back)
	}
	if !strings.Contains(res.Table(), "cell [3 4] observed=4 expected=5") {
		t.Errorf("table:\n%s", res.Table())
	}
}
