package stats

import (
	"math"
	"testing"
)

// referenceTable is the sample-size table of shared/reference/statistics.md:
// probes for power 0.99 at alpha 0.001 when one of k endpoints is off by a
// relative delta (5, 10, 20 %).
var referenceTable = map[int][3]int{
	2:  {11776, 2944, 736},
	3:  {26623, 6656, 1664},
	5:  {61372, 15343, 3836},
	10: {168136, 42034, 10509},
	20: {439093, 109773, 27443},
	50: {1545574, 386393, 96598},
}

var referenceDeltas = [3]float64{0.05, 0.10, 0.20}

// TestReferenceTable reproduces the reference table with Patnaik's
// approximation (exactly, as round(λ/w²); and within one probe as the
// smallest n reaching the power), and shows how far the exact noncentral
// chi-square sizes lie from it and what power the table's sizes really have.
func TestReferenceTable(t *testing.T) {
	const alpha, power = 0.001, 0.99
	t.Logf("%3s %5s %10s %10s %10s %7s %12s", "k", "delta", "table", "patnaik", "exact", "exact/", "exact power")
	t.Logf("%3s %5s %10s %10s %10s %7s %12s", "", "", "", "(ceil)", "", "table", "at table n")
	for _, k := range []int{2, 3, 5, 10, 20, 50} {
		df := k - 1
		lp := RequiredNoncentralityPatnaik(df, alpha, power)
		for j, delta := range referenceDeltas {
			want := referenceTable[k][j]
			w2 := EffectW2(Uniform(k), OneOffAlternative(k, delta))
			checkRel(t, "w² = δ²/(k-1)", w2, delta*delta/float64(df), 1e-12)
			if got := int(math.Round(lp / w2)); got != want {
				t.Errorf("k = %d, delta = %g: round(λ/w²) = %d, table %d", k, delta, got, want)
			}
			np := ChiSquareSampleSizePatnaik(w2, df, alpha, power)
			if np < want || np > want+1 || math.Abs(float64(np-want)) > 0.01*float64(want) {
				t.Errorf("k = %d, delta = %g: Patnaik sample size %d, table %d", k, delta, np, want)
			}
			if pw := ChiSquarePowerPatnaik(np, w2, df, alpha); pw < power || ChiSquarePowerPatnaik(np-1, w2, df, alpha) >= power {
				t.Errorf("k = %d, delta = %g: %d is not the smallest n reaching Patnaik power %v", k, delta, np, power)
			}
			ne := ChiSquareSampleSize(w2, df, alpha, power)
			ratio := float64(ne) / float64(want)
			// Patnaik is optimistic, most for df = 1: the exact sizes are 1 % (k = 50)
			// to 7.2 % (k = 2) larger.
			if ratio < 1 || ratio > 1.08 {
				t.Errorf("k = %d, delta = %g: exact size %d is %.3f × the table's", k, delta, ne, ratio)
			}
			if ChiSquarePower(ne, w2, df, alpha) < power || ChiSquarePower(ne-1, w2, df, alpha) >= power {
				t.Errorf("k = %d, delta = %g: %d is not the smallest n reaching power %v", k, delta, ne, power)
			}
			t.Logf("%3d %4.0f%% %10d %10d %10d %7.4f %12.5f", k, 100*delta, want, np, ne, ratio, ChiSquarePower(want, w2, df, alpha))
		}
	}
}

// TestReferenceRemarks checks the other sizes quoted by the reference: the
// Holm first-step size, and the uniform-probability fault with 3 endpoints.
func TestReferenceRemarks(t *testing.T) {
	w2 := EffectW2(Uniform(10), OneOffAlternative(10, 0.10))
	holm := 0.001 / 30
	lp := RequiredNoncentralityPatnaik(9, holm, 0.99)
	if got := int(math.Round(lp / w2)); got != 53035 {
		t.Errorf("Holm step: round(λ/w²) = %d, reference 53035", got)
	}
	ne := ChiSquareSampleSize(w2, 9, holm, 0.99)
	growth := float64(ChiSquareSampleSizePatnaik(w2, 9, holm, 0.99)) / float64(referenceTable[10][1])
	t.Logf("k = 10, delta = 10 %%, alpha = 0.001/30: Patnaik %d (round %d, reference 53,035; %.1f %% more than at alpha 0.001), exact %d",
		ChiSquareSampleSizePatnaik(w2, 9, holm, 0.99), int(math.Round(lp/w2)), 100*(growth-1), ne)
	if growth < 1.25 || growth > 1.35 {
		t.Errorf("Holm step grows the size by %.3f, reference says 25-35 %%", growth)
	}

	// uniform-probability fault: 1/3, 2/9, 4/9 instead of 1/3 each: w ≈ 0.27,
	// about 450 probes (600 after Holm over 30 checks).
	w2 = EffectW2(Uniform(3), []float64{1.0 / 3, 2.0 / 9, 4.0 / 9})
	checkRel(t, "w", math.Sqrt(w2), 0.2722, 1e-3)
	n1 := ChiSquareSampleSizePatnaik(w2, 2, 0.001, 0.99)
	n30 := ChiSquareSampleSizePatnaik(w2, 2, holm, 0.99)
	t.Logf("uniform-probability fault, 3 endpoints: w = %.4f, Patnaik %d (exact %d), after Holm over 30 checks %d (exact %d)",
		math.Sqrt(w2), n1, ChiSquareSampleSize(w2, 2, 0.001, 0.99), n30, ChiSquareSampleSize(w2, 2, holm, 0.99))
	if math.Abs(float64(n1)-450) > 10 || math.Abs(float64(n30)-600) > 15 {
		t.Errorf("uniform-probability fault sizes %d and %d, reference about 450 and 600", n1, n30)
	}
}

// TestNoncentralChiSquare compares with mpmath at 50 digits (full Poisson
// mixture sums), including tails far below 1e-12.
func TestNoncentralChiSquare(t *testing.T) {
	cases := []struct {
		x, k, lambda float64
		sf, cdf      float64 // one of them; 0 = not checked
	}{
		{10.827566170662733, 1, 29.44, 0.98363326405771169459, 0},
		{10.827566170662733, 1, 31.5, 0.98988243768447991792, 0},
		{27.877164871256568, 9, 46.704, 0.98685046962160955029, 0},
		{16.918977604620448, 9, 0.5, 0.066074715255394535125, 0},
		{3.0, 2, 0.001, 0.22329749730844352366, 0.77670250269155647634},
		{200, 10, 100, 8.3153227857921571218e-5, 0.99991684677214207843},
		{1e-3, 3, 2, 0.99999690628080656401, 3.0937191934359919284e-6},
		{50, 5, 200, 0.99999999999981696874, 1.8303126061724451795e-13},
		{5, 10, 50, 0, 1.5289064311270403714e-9},
		{30, 4, 400, 0, 6.0916241964438062545e-49},
		{900, 20, 400, 3.4619238772143246735e-22, 0},
	}
	for _, c := range cases {
		if c.sf != 0 {
			if got := NoncentralChiSquareSurvival(c.x, c.k, c.lambda); !relClose(got, c.sf, 1e-10) {
				t.Errorf("survival(%v; %v, %v) = %.17g, want %.17g", c.x, c.k, c.lambda, got, c.sf)
			}
		}
		if c.cdf != 0 {
			if got := NoncentralChiSquareCDF(c.x, c.k, c.lambda); !relClose(got, c.cdf, 1e-8) {
				t.Errorf("cdf(%v; %v, %v) = %.17g, want %.17g", c.x, c.k, c.lambda, got, c.cdf)
			}
		}
	}
	// lambda = 0 is the central chi-square; power at w2 = 0 is alpha.
	checkRel(t, "central", NoncentralChiSquareSurvival(3.841458820694124, 1, 0), 0.05, 1e-10)
	checkRel(t, "power at no effect", ChiSquarePower(1000, 0, 4, 0.01), 0.01, 1e-9)
	checkRel(t, "Patnaik at no effect", ChiSquarePowerPatnaik(1000, 0, 4, 0.01), 0.01, 1e-9)
	for _, bad := range []float64{ChiSquarePower(-1, 0.1, 2, 0.05), ChiSquarePower(10, 0.1, 0, 0.05), ChiSquarePower(10, 0.1, 2, 1),
		NoncentralChiSquareSurvival(1, 0, 1), NoncentralChiSquareSurvival(1, 1, -1)} {
		if !math.IsNaN(bad) {
			t.Errorf("invalid arguments gave %v, want NaN", bad)
		}
	}
	if ChiSquareSampleSize(0, 2, 0.05, 0.9) != -1 || ChiSquareSampleSize(0.1, 2, 0.05, 1) != -1 {
		t.Error("impossible sample sizes should be -1")
	}
}

func TestEffectW2AndOneOff(t *testing.T) {
	p := OneOffAlternative(4, 0.2)
	want := []float64{0.3, 0.7 / 3, 0.7 / 3, 0.7 / 3}
	var sum float64
	for i := range p {
		checkRel(t, "OneOffAlternative", p[i], want[i], 1e-14)
		sum += p[i]
	}
	checkRel(t, "sum", sum, 1, 1e-14)
	checkRel(t, "EffectW2", EffectW2(Uniform(4), p), 0.04/3, 1e-12)
	if !math.IsInf(EffectW2([]float64{1, 0}, []float64{0.9, 0.1}), 1) {
		t.Error("an alternative on a zero-probability cell should have infinite effect")
	}
	defer func() {
		if recover() == nil {
			t.Error("OneOffAlternative(1, 0.1) did not panic")
		}
	}()
	OneOffAlternative(1, 0.1)
}
