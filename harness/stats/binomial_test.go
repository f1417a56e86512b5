package stats

import (
	"math"
	"slices"
	"testing"
)

// Reference p-values computed with mpmath at 40 digits (exact pmf sums, R's
// binom.test rule for the two-sided case).
var binomialReference = []struct {
	k, n                    int
	p                       float64
	twoSided, greater, less float64
}{
	{3, 10, 0.3, 1, 0.61721721359999997038, 0.64961071840000002962},
	{0, 10, 0.3, 0.038839603300000002148, 1, 0.02824752490000000448},
	{7, 20, 0.5, 0.26317596435546875, 0.942340850830078125, 0.131587982177734375},
	{682, 925, 0.75, 0.38249155957485168132, 0.82408912235242257935, 0.19600926705388334616}, // R's ?binom.test example
	{2, 100, 0.1, 0.0039234455176512478936, 0.99967831194680588518, 0.0019448846518800153855},
	{5005000, 10_000_000, 0.5, 0.0015671019056953984809, 0.00078355095284769924046, 0.9992181491198636118},
	{3002000, 10_000_000, 0.3, 0.16754628917395682569, 0.083832658813274966703, 0.91627354899485580972},
	{2997500, 10_000_000, 0.3, 0.084560112713431464706, 0.95779029593128884893, 0.042271866745565534393},
	{1001000, 10_000_000, 0.1, 0.29184052731377428858, 0.1460444761145136192, 0.85419673238387242453},
	{30, 10_000_000, 1e-6, 2.5099024221281294741e-7, 2.5099024221281294741e-7, 0.99999992016376495712},
	{0, 10_000_000, 1e-6, 0.000092348571982695509014, 1, 0.000045399702763252225376},
}

func TestBinomialTestReference(t *testing.T) {
	for _, c := range binomialReference {
		for _, alt := range []Alternative{TwoSided, Greater, Less} {
			want := map[Alternative]float64{TwoSided: c.twoSided, Greater: c.greater, Less: c.less}[alt]
			res, err := BinomialTest(c.k, c.n, c.p, alt)
			if err != nil {
				t.Fatal(err)
			}
			if !relClose(res.P, want, 1e-9) {
				t.Errorf("BinomialTest(%d, %d, %g, %s).P = %.17g, want %.17g", c.k, c.n, c.p, alt, res.P, want)
			}
		}
	}
}

func TestBinomialTestResult(t *testing.T) {
	res, err := BinomialTest(682, 925, 0.75, TwoSided)
	if err != nil {
		t.Fatal(err)
	}
	if res.Statistic != 682 || res.N != 925 || res.Alternative != "two-sided" || len(res.Cells) != 2 {
		t.Errorf("result %+v", res)
	}
	checkRel(t, "effect size", res.EffectSize, math.Abs(682.0/925-0.75)/math.Sqrt(0.75*0.25), 1e-12)
	// Deterministic p: stickiness that must always hold.
	res, err = BinomialTest(10, 10, 1, TwoSided)
	if err != nil || res.P != 1 {
		t.Errorf("k = n with p = 1: %+v %v", res, err)
	}
	res, err = BinomialTest(9, 10, 1, TwoSided)
	if err != nil || res.P != 0 || !slices.Equal(res.Impossible, []int{1}) {
		t.Errorf("a violation with p = 1: %+v %v", res, err)
	}
	for _, bad := range []struct {
		k, n int
		p    float64
		alt  Alternative
	}{{-1, 10, 0.5, TwoSided}, {11, 10, 0.5, TwoSided}, {0, 0, 0.5, TwoSided}, {1, 10, 1.5, TwoSided}, {1, 10, math.NaN(), TwoSided}, {1, 10, 0.5, Alternative(7)}} {
		if _, err := BinomialTest(bad.k, bad.n, bad.p, bad.alt); err == nil {
			t.Errorf("BinomialTest(%v) gave no error", bad)
		}
	}
}

// TestLogBinomPMF checks Loader's expansion against direct lgamma sums at
// small n (where lgamma is exact enough) and normalisation at n = 1e7.
func TestLogBinomPMF(t *testing.T) {
	for _, n := range []int{1, 2, 7, 30, 100, 1000} {
		for _, p := range []float64{0.01, 0.3, 0.5, 0.97} {
			for k := 0; k <= n; k += max(1, n/37) {
				a, _ := math.Lgamma(float64(n + 1))
				b, _ := math.Lgamma(float64(k + 1))
				c, _ := math.Lgamma(float64(n - k + 1))
				want := a - b - c + float64(k)*math.Log(p) + float64(n-k)*math.Log1p(-p)
				if got := logBinomPMF(k, n, p); math.Abs(got-want) > 1e-11*max(1, math.Abs(want)) {
					t.Errorf("logBinomPMF(%d, %d, %g) = %v, want %v", k, n, p, got, want)
				}
			}
		}
	}
	// The tails on both sides of any point add to 1.
	const n = 10_000_000
	for _, p := range []float64{1e-6, 0.1, 0.5} {
		for _, k := range []int{0, int(n*p) - 3000, int(n * p), int(n*p) + 1, int(n*p) + 5000} {
			if k < 0 {
				continue
			}
			if s := binomLower(k, n, p) + binomUpper(k+1, n, p); math.Abs(s-1) > 1e-12 {
				t.Errorf("n = %d, p = %g, k = %d: tails add to 1%+.3g", n, p, k, s-1)
			}
		}
	}
}

func TestClopperPearson(t *testing.T) {
	// Reference bounds from mpmath (bisection on the regularised incomplete beta).
	cases := []struct {
		k, n   int
		conf   float64
		lo, hi float64
	}{
		{682, 925, 0.95, 0.70766826407903903, 0.76540655824152524},
		{3, 10, 0.95, 0.06673951117773449, 0.65245285005999724},
		{0, 20, 0.95, 0, 0.1684334709830853},
		{20, 20, 0.95, 0.8315665290169147, 1},
		{500, 10000, 0.999, 0.043119278764608934, 0.05756674958369287},
		{9990, 10000, 0.999, 0.99747636998158187, 0.99973001161776763},
		{1, 100000, 0.99, -math.Expm1(math.Log1p(-0.005) / 100000), 0}, // hi checked below
	}
	for _, c := range cases {
		lo, hi := ClopperPearson(c.k, c.n, c.conf)
		if !relClose(lo, c.lo, 1e-9) {
			t.Errorf("ClopperPearson(%d, %d, %g) lo = %.17g, want %.17g", c.k, c.n, c.conf, lo, c.lo)
		}
		if c.hi != 0 && !relClose(hi, c.hi, 1e-9) {
			t.Errorf("ClopperPearson(%d, %d, %g) hi = %.17g, want %.17g", c.k, c.n, c.conf, hi, c.hi)
		}
		// Definition: P_lo(X >= k) = P_hi(X <= k) = (1-conf)/2.
		a := (1 - c.conf) / 2
		if c.k > 0 {
			checkRel(t, "upper tail at lo", binomUpper(c.k, c.n, lo), a, 1e-7)
		}
		if c.k < c.n {
			checkRel(t, "lower tail at hi", binomLower(c.k, c.n, hi), a, 1e-7)
		}
	}
	// Large n: the bounds still satisfy their definition.
	for _, c := range [][2]int{{5_000_000, 10_000_000}, {100, 10_000_000}, {99_000, 100_000}} {
		lo, hi := ClopperPearson(c[0], c[1], 0.999)
		checkRel(t, "upper tail at lo, large n", binomUpper(c[0], c[1], lo), 0.0005, 1e-6)
		checkRel(t, "lower tail at hi, large n", binomLower(c[0], c[1], hi), 0.0005, 1e-6)
	}
	if lo, hi := ClopperPearson(5, 4, 0.95); !math.IsNaN(lo) || !math.IsNaN(hi) {
		t.Errorf("k > n gave %v, %v", lo, hi)
	}
}

func TestBinomialPower(t *testing.T) {
	// Size: with p1 = p0 the power is the exact size, at most alpha; for
	// Greater it is P(X >= c) at the smallest c with P(X >= c) <= alpha.
	n, p0, alpha := 50, 0.3, 0.05
	size := BinomialPower(n, p0, p0, alpha, Greater)
	c := 0
	for binomUpper(c, n, p0) > alpha {
		c++
	}
	checkRel(t, "size (greater)", size, binomUpper(c, n, p0), 1e-14)
	for _, alt := range []Alternative{TwoSided, Greater, Less} {
		s := BinomialPower(n, p0, p0, alpha, alt)
		if s > alpha {
			t.Errorf("%s: size %v > alpha", alt, s)
		}
		// Brute force: sum the pmf of every outcome the test rejects.
		for _, p1 := range []float64{p0, 0.1, 0.45, 0.6} {
			var want float64
			for k := 0; k <= n; k++ {
				if r, _ := BinomialTest(k, n, p0, alt); r.P <= alpha {
					want += math.Exp(logBinomPMF(k, n, p1))
				}
			}
			checkRel(t, "power "+alt.String(), BinomialPower(n, p0, p1, alpha, alt), want, 1e-10)
		}
	}
	// Deterministic null (affinity that must hold): any miss rejects, as BinomialTest does.
	for _, alt := range []Alternative{TwoSided, Greater, Less} {
		checkRel(t, "p0 = 1", BinomialPower(10, 1, 0.9, 0.01, alt), 1-math.Pow(0.9, 10), 1e-12)
		checkRel(t, "p0 = 0", BinomialPower(10, 0, 0.1, 0.01, alt), 1-math.Pow(0.9, 10), 1e-12)
		if r, _ := BinomialTest(1, 10, 0, alt); r.P != 0 {
			t.Errorf("%s: an outcome impossible under p0 = 0 gave P = %v", alt, r.P)
		}
	}
}

func TestBinomialSampleSize(t *testing.T) {
	// Affinity expiry with 3 endpoints: (k-1)/k = 2/3 should switch; a dataplane
	// whose stickiness survives half the time switches 1/3 of the time.
	n := BinomialSampleSize(2.0/3, 1.0/3, 0.001/30, 0.99, Less)
	if n < 1 {
		t.Fatalf("sample size %d", n)
	}
	if pw := BinomialPower(n, 2.0/3, 1.0/3, 0.001/30, Less); pw < 0.99 {
		t.Errorf("power at n = %d is %v < 0.99", n, pw)
	}
	for m := 1; m < n; m++ {
		if pw := BinomialPower(m, 2.0/3, 1.0/3, 0.001/30, Less); pw >= 0.99 {
			t.Errorf("n = %d already reaches power %v, BinomialSampleSize gave %d", m, pw, n)
		}
	}
	t.Logf("affinity expiry, 3 endpoints, switch rate 1/3 instead of 2/3: n = %d at alpha 0.001/30, power 0.99", n)
	for _, c := range []struct {
		p0, p1 float64
		alt    Alternative
	}{{0.5, 0.5, TwoSided}, {0.5, 0.4, Greater}, {0.5, 0.6, Less}, {0.5, 0.5 + 1e-9, TwoSided}} {
		if n := BinomialSampleSize(c.p0, c.p1, 0.05, 0.8, c.alt); n != -1 {
			t.Errorf("BinomialSampleSize(%v) = %d, want -1", c, n)
		}
	}
}
