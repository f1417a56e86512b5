package stats_test

import (
	"fmt"
	"math/rand/v2"

	"github.com/kpsim/kpsim/harness/stats"
)

// A distribution check over three endpoints, probed in the blocks the
// design's looks ask for until the test decides.
func ExampleDesignSequential() {
	p0 := stats.Uniform(3)
	d, err := stats.DesignSequential(p0, 0.1, stats.DefaultFamilyAlpha/40, stats.DefaultPower, 0)
	if err != nil {
		panic(err)
	}
	fmt.Printf("looks %d..%d, FixedN %d\n", d.Looks[0], d.Looks[len(d.Looks)-1], d.FixedN)

	r := rand.New(rand.NewPCG(1, 2)) // stands in for the probes of a correct dataplane
	test := d.Start()
	counts := make([]float64, 3)
	block := make([]int, 3)
	sent := 0
	for _, look := range d.Looks {
		stats.SampleMultinomial(r, look-sent, p0, block)
		sent = look
		for i, c := range block {
			counts[i] += float64(c)
		}
		dec, err := test.Look(counts)
		if err != nil {
			panic(err)
		}
		if dec != stats.SeqContinue {
			break
		}
	}
	res := test.Result()
	fmt.Printf("%s after %g probes, p = %.3g\n", test.Decision(), res.N, res.P)
	// Output:
	// looks 2340..11076, FixedN 9360
	// accept after 2652 probes, p = 1
}
