// Package stats holds the statistical decisions of the conformance harness:
// goodness-of-fit tests over endpoint counts (Pearson chi-square and G-test),
// the exact binomial test with Clopper-Pearson intervals, Holm's step-down
// correction over the checks of a run, and the power and sample-size
// arithmetic that sizes each check (noncentral chi-square, exact binomial).
// It also holds the truncated sequential likelihood-ratio test that stops a
// distribution check early (DesignSequential), simultaneous intervals and
// equivalence (TOST) for endpoint shares, the Kolmogorov-Smirnov test of
// p-value uniformity, and the sizing of deterministic (leak) checks.
//
// Both the simulator and the kernel harness call it. It keeps no state but
// DesignSequential's cache of designs (guarded by a mutex) and draws no
// random numbers of its own: the samplers take their random source as an
// argument, and the sequential design's Monte Carlo uses a fixed seed, so
// designs are deterministic.
//
// Conventions: a test rejects when P <= alpha (see Result.Rejects); the
// family-wise level of a run defaults to 0.001 with Holm, and checks are
// sized for power 0.99 at their minimum detectable effect
// (see shared/reference/statistics.md and README.md beside this file).
package stats
