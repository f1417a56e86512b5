package stats

import (
	"fmt"
	"testing"
)

// BenchmarkDesignSequential measures the cost of designing one check
// (uncached) at the suite's operating point.
func BenchmarkDesignSequential(b *testing.B) {
	for _, k := range []int{5, 50, 200} {
		b.Run(fmt.Sprintf("k=%d", k), func(b *testing.B) {
			for b.Loop() {
				if _, err := designSequential(Uniform(k), 0.1, operatingAlpha, DefaultPower, 0, defaultSeqTuning); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSequentialTuning reports, for variants of the design choices,
// the ratio FixedN/E0[N], NMax/FixedN and the achieved power at the
// operating point: go test -run XXX -bench SequentialTuning -benchtime 1x.
// defaultSeqTuning was chosen from it.
func BenchmarkSequentialTuning(b *testing.B) {
	variants := map[string]seqTuning{"default": defaultSeqTuning}
	for _, v := range []struct {
		name string
		edit func(*seqTuning)
	}{
		{"looks=20,first=0", func(s *seqTuning) { s.lookDiv, s.firstFrac = 20, 0 }},
		{"looks=40,first=0.2", func(s *seqTuning) { s.lookDiv, s.firstFrac = 40, 0.2 }},
		{"B=0.5(1-power)", func(s *seqTuning) { s.acceptFrac = 0.5 }},
		{"B=0.7(1-power)", func(s *seqTuning) { s.acceptFrac = 0.7 }},
		{"alphaSeq=0.8alpha", func(s *seqTuning) { s.seqShare = 0.8 }},
		{"margin=0SE", func(s *seqTuning) { s.marginSE = 0 }},
	} {
		t := defaultSeqTuning
		v.edit(&t)
		variants[v.name] = t
	}
	for name, tune := range variants {
		for _, k := range []int{2, 3, 5, 20, 50} {
			b.Run(fmt.Sprintf("%s/k=%d", name, k), func(b *testing.B) {
				for b.Loop() {
					d, err := designSequential(Uniform(k), 0.1, operatingAlpha, DefaultPower, 0, tune)
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(d.FixedN)/d.ExpectedN0, "FixedN/E0N")
					b.ReportMetric(d.ExpectedN0, "E0N")
					b.ReportMetric(float64(d.Looks[len(d.Looks)-1])/float64(d.FixedN), "NMax/FixedN")
					b.ReportMetric(d.Achieved, "power")
				}
			})
		}
	}
}
