package stats

import "math"

// LeakSampleSize returns the smallest number of probes n for which a leak
// that sends each probe to a forbidden outcome with probability f is seen
// at least once with probability power: 1 - (1-f)^n >= power. It returns -1
// unless 0 < f <= 1 and 0 < power < 1.
func LeakSampleSize(f, power float64) int {
	if !(f > 0 && f <= 1) || !(power > 0 && power < 1) {
		return -1
	}
	if f == 1 {
		return 1
	}
	n := max(1, int(math.Ceil(math.Log1p(-power)/math.Log1p(-f))))
	// Settle the rounding of the logarithms against LeakPower itself.
	for n > 1 && LeakPower(n-1, f) >= power {
		n--
	}
	for LeakPower(n, f) < power {
		n++
	}
	return n
}

// LeakPower returns the probability 1 - (1-f)^n that n probes see a leak of
// fraction f at least once (computed as -expm1(n·log1p(-f)), exact for tiny
// f). It returns NaN for n < 0 or f outside [0, 1].
func LeakPower(n int, f float64) float64 {
	if n < 0 || !(f >= 0 && f <= 1) {
		return math.NaN()
	}
	if f == 1 {
		if n == 0 {
			return 0
		}
		return 1
	}
	return -math.Expm1(float64(n) * math.Log1p(-f))
}
