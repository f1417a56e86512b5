package conform

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Repetition is N real runs of the same suite on a correct dataplane, each
// statistical verdict's p-values kept and tested for uniformity: the check
// of the whole probe path (independence, loss, the kernel's draws) that no
// simulation can give. Under a correct dataplane with independent probes a
// fixed-size chi-square's p-value is uniform; probes that reuse conntrack
// tuples make the counts over-dispersed and the p-values pile up near 0.
type Repetition struct {
	Mode  cluster.Mode `json:"mode"`
	Runs  int          `json:"runs"`
	Fixed bool         `json:"fixedSize"`
	// FailedRuns counts runs with a failed verdict after Holm.
	FailedRuns int `json:"failedRuns"`
	// ErroredRuns counts runs with an error verdict (environment).
	ErroredRuns int          `json:"erroredRuns"`
	Verdicts    []Uniformity `json:"verdicts"`
	// Pooled is every statistical verdict's p-values together.
	Pooled   Uniformity    `json:"pooled"`
	Duration time.Duration `json:"durationNs"`
}

// Uniformity is the Kolmogorov-Smirnov test of one verdict's p-values
// against U(0,1): two-sided (uniform), and one-sided D+ (valid: not
// stochastically smaller than uniform, which is all a conservative test such
// as the sequential one promises).
type Uniformity struct {
	Name   string    `json:"name"`
	N      int       `json:"n"`
	D      float64   `json:"d"`
	P      float64   `json:"p"`
	DPlus  float64   `json:"dPlus"`
	PPlus  float64   `json:"pPlus"`
	Below5 int       `json:"pBelow0.05"`
	PS     []float64 `json:"pValues,omitempty"`
	// Failed counts the runs in which the verdict failed; with a fault
	// injected it is the catch count, to hold against Power (the verdict's
	// mean achieved power at its MDE) with the Clopper-Pearson interval
	// CatchLow-CatchHigh (99 %).
	Failed              int     `json:"failed"`
	Power               float64 `json:"power"`
	CatchLow, CatchHigh float64
}

// Repeat runs the scenarios n times on this machine's kernel with seeds
// seed, seed+1, ... and tests every statistical verdict's p-values.
func Repeat(ctx context.Context, files []string, o Options, n int, seed uint64) (*Repetition, []*report.Run, error) {
	start := time.Now()
	rep := &Repetition{Mode: o.Mode, Runs: n, Fixed: o.FixedSize}
	byName := map[string][]float64{}
	failed := map[string]int{}
	power := map[string]float64{}
	var runs []*report.Run
	log := o.Log
	if log == nil {
		log = io.Discard
	}
	for i := 0; i < n; i++ {
		sd := seed + uint64(i)
		o.Seed = &sd
		run, err := Run(ctx, files, o)
		if err != nil {
			return nil, runs, err
		}
		runs = append(runs, run)
		if len(run.Failed()) > 0 {
			rep.FailedRuns++
		}
		errored := false
		for _, s := range run.Suites {
			errored = errored || s.SetupError != ""
			for _, c := range s.Checks {
				errored = errored || c.Verdict == report.Error
				key := s.Scenario + "/" + c.Name
				if c.Verdict == report.Fail {
					failed[key]++
				}
				if c.Verdict != report.Error && c.Verdict != report.NotRun && c.Type != typeEquivalence {
					if _, ok := byName[key]; !ok {
						byName[key] = nil
					}
					power[key] += c.AchievedPower / float64(n)
					if statistical(c) {
						byName[key] = append(byName[key], c.P)
					}
				}
			}
		}
		if errored {
			rep.ErroredRuns++
		}
		fmt.Fprintf(log, "conform: repeat %d of %d: %d failed\n", i+1, n, len(run.Failed()))
	}
	var names []string
	for k := range byName {
		names = append(names, k)
	}
	sort.Strings(names)
	var all []float64
	for _, k := range names {
		u := uniformity(k, byName[k])
		u.Failed, u.Power = failed[k], power[k]
		u.CatchLow, u.CatchHigh = stats.ClopperPearson(u.Failed, n, 0.99)
		rep.Verdicts = append(rep.Verdicts, u)
		all = append(all, byName[k]...)
	}
	rep.Pooled = uniformity("pooled", all)
	rep.Pooled.PS = nil
	rep.Duration = time.Since(start)
	return rep, runs, nil
}

// statistical says whether a verdict's p-value comes from a test with a
// continuous null distribution (not a deterministic 0/1).
func statistical(c *report.Check) bool {
	return c.Test != "" && c.Test != "deterministic" && c.Test != "none" && c.N > 0
}

func uniformity(name string, ps []float64) Uniformity {
	u := Uniformity{Name: name, N: len(ps), PS: ps}
	if len(ps) == 0 {
		return u
	}
	u.D, u.P = stats.KSUniform(ps)
	u.DPlus, u.PPlus = stats.KSUniformUpper(ps)
	for _, p := range ps {
		if p <= 0.05 {
			u.Below5++
		}
	}
	return u
}

// String is the repetition's summary in a few lines.
func (r *Repetition) String() string {
	var b strings.Builder
	mode := "sequential"
	if r.Fixed {
		mode = "fixed-size"
	}
	fmt.Fprintf(&b, "%s, %d runs (%s tests): %d failed, %d with errors; pooled p-values of %d verdicts x runs: KS D = %.4f, p = %.3g; D+ = %.4f, p = %.3g; %d of %d at p <= 0.05\n",
		r.Mode, r.Runs, mode, r.FailedRuns, r.ErroredRuns, len(r.Verdicts), r.Pooled.D, r.Pooled.P, r.Pooled.DPlus, r.Pooled.PPlus, r.Pooled.Below5, r.Pooled.N)
	for _, v := range r.Verdicts {
		ks := "no p-values (deterministic)"
		if v.N > 0 {
			ks = fmt.Sprintf("KS p %.3g  D+ p %.3g  p<=0.05: %2d", v.P, v.PPlus, v.Below5)
		}
		fmt.Fprintf(&b, "  %-90s n %3d  %s  failed %3d of %d (99%% CI %.3f-%.3f), power %.4f\n",
			v.Name, v.N, ks, v.Failed, r.Runs, v.CatchLow, v.CatchHigh, v.Power)
	}
	return b.String()
}
