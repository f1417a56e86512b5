// Package stats holds the statistical decisions of the conformance harness:
// goodness-of-fit tests over endpoint counts (Pearson chi-square and G-test),
// the exact binomial test with Clopper-Pearson intervals, Holm's step-down
// correction over the checks of a run, and the power and sample-size
// arithmetic that sizes each check (noncentral chi-square, exact binomial).
//
// Both the simulator and the kernel harness call it, so it holds no state and
// draws no random numbers of its own: the one sampler, SampleMultinomial,
// takes its random source as an argument.
//
// Conventions: a test rejects when P <= alpha (see Result.Rejects); the
// family-wise level of a run defaults to 0.001 with Holm, and checks are
// sized for power 0.99 at their minimum detectable effect
// (see shared/reference/statistics.md and README.md beside this file).
package stats
