package stats

import (
	"math"
	"testing"
)

// TestLeakSampleSize: the smallest n with 1-(1-f)^n >= power, checked
// against LeakPower on both sides, and the audit's figures: 100 probes see a
// 1 % leak with probability 0.634 and reach 0.99 only for f >= 4.5 %.
func TestLeakSampleSize(t *testing.T) {
	for _, c := range []struct{ f, power float64 }{{0.01, 0.99}, {0.001, 0.99}, {0.1, 0.999}, {1e-6, 0.5}, {0.5, 0.75}} {
		n := LeakSampleSize(c.f, c.power)
		if LeakPower(n, c.f) < c.power || (n > 1 && LeakPower(n-1, c.f) >= c.power) {
			t.Errorf("LeakSampleSize(%g, %g) = %d: power %g there, %g one less", c.f, c.power, n, LeakPower(n, c.f), LeakPower(n-1, c.f))
		}
		t.Logf("f=%g power=%g: n=%d", c.f, c.power, n)
	}
	if n := LeakSampleSize(0.01, 0.99); n != 459 {
		t.Errorf("LeakSampleSize(0.01, 0.99) = %d, want 459 (log 0.01 / log 0.99 = 458.2)", n)
	}
	checkRel(t, "LeakPower(100, 0.01)", LeakPower(100, 0.01), 1-math.Pow(0.99, 100), 1e-12)
	if n := LeakSampleSize(0.046, 0.99); n > 100 {
		t.Errorf("a 4.6 %% leak needs %d probes, the audit says 100 suffice from about 4.5 %%", n)
	}
	checkRel(t, "LeakPower(1e6, 1e-12)", LeakPower(1e6, 1e-12), 1e-6, 1e-6)
	for _, bad := range []struct{ f, power float64 }{{0, 0.9}, {1.1, 0.9}, {0.1, 1}, {0.1, 0}, {math.NaN(), 0.5}} {
		if n := LeakSampleSize(bad.f, bad.power); n != -1 {
			t.Errorf("LeakSampleSize(%g, %g) = %d, want -1", bad.f, bad.power, n)
		}
	}
	if n, p := LeakSampleSize(1, 0.9), LeakPower(0, 0.5); n != 1 || p != 0 {
		t.Errorf("edge cases: LeakSampleSize(1, 0.9) = %d, LeakPower(0, 0.5) = %g", n, p)
	}
}
