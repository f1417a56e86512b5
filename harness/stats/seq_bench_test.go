package stats

import "testing"

func BenchmarkDesignSequential50(b *testing.B) {
	for b.Loop() {
		if _, err := designSequential(Uniform(50), 0.1, 0.001/40, 0.99, 0, defaultSeqTuning); err != nil {
			b.Fatal(err)
		}
	}
}
