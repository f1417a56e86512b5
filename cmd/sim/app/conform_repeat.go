package app

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/harness/conform"
	"github.com/kpsim/kpsim/harness/stats"
)

// checkerFlags are conform's flags for checking the checker: the harness
// calibration on the simulated machine (--calibrate), repeated real runs
// (--repeat) and the equivalence verdicts.
type checkerFlags struct {
	calibrate   int
	repeat      int
	fixed       bool
	loss        float64
	out         string
	equivalence float64
	eqAlpha     float64
}

func (f *checkerFlags) add(c *cobra.Command) {
	c.Flags().IntVar(&f.calibrate, "calibrate", 0, "run the suite N times on the simulated machine (no root: the engines, the run's own probe plan, sizing and decisions) and test the false-failure rate against the family alpha")
	c.Flags().IntVar(&f.repeat, "repeat", 0, "run the suite N times on this kernel and test each verdict's p-values for uniformity (Kolmogorov-Smirnov); with --fault, the catch rate of each verdict against its power")
	c.Flags().BoolVar(&f.fixed, "fixed", false, "fixed-size chi-square tests instead of sequential ones (their p-values are uniform on a correct dataplane: use with --repeat)")
	c.Flags().Float64Var(&f.loss, "loss", 0, "with --calibrate: the probability that the observer misses a delivered probe")
	c.Flags().StringVar(&f.out, "checker-json", "", "with --calibrate or --repeat: write the result as JSON to this file")
	c.Flags().Float64Var(&f.equivalence, "equivalence", 0, "add an equivalence verdict to every distribution check: every endpoint's share within (1 +- DELTA) of its expected share (TOST)")
	c.Flags().Float64Var(&f.eqAlpha, "equivalence-alpha", 0.05, "level of the equivalence verdicts")
}

// options copies the flags into the run's options, or says what is wrong.
func (f *checkerFlags) options(o *conform.Options) error {
	if f.calibrate < 0 || f.repeat < 0 || (f.calibrate > 0 && f.repeat > 0) {
		return &UsageError{Err: fmt.Errorf("--calibrate and --repeat take a positive count, and only one of them")}
	}
	if f.equivalence < 0 || f.equivalence >= 1 || !(f.eqAlpha > 0 && f.eqAlpha < 0.5) {
		return &UsageError{Err: fmt.Errorf("--equivalence takes a relative margin in [0, 1) and --equivalence-alpha a level in (0, 0.5)")}
	}
	if f.loss < 0 || f.loss >= 1 || (f.loss > 0 && f.calibrate == 0) {
		return &UsageError{Err: fmt.Errorf("--loss takes a probability in [0, 1), with --calibrate")}
	}
	o.FixedSize, o.Equivalence, o.EquivalenceAlpha = f.fixed, f.equivalence, f.eqAlpha
	return nil
}

// run handles --calibrate and --repeat; handled is false for a plain run.
func (f *checkerFlags) run(ctx context.Context, s Streams, files []string, o conform.Options, seed uint64) (handled bool, err error) {
	switch {
	case f.calibrate > 0:
		c, err := conform.Calibrate(ctx, files, o, f.calibrate, seed, f.loss)
		if err != nil {
			return true, err
		}
		fmt.Fprintln(s.Out, c)
		if err := f.write(c); err != nil {
			return true, err
		}
		if c.P <= 0.001 || (f.loss == 0 && c.Errored > 0) {
			return true, &CheckFailedError{Failed: []string{fmt.Sprintf("harness calibration (%d of %d runs failed, %d errored)", c.Failed, c.Runs, c.Errored)}}
		}
		return true, nil
	case f.repeat > 0:
		if err := conform.Preflight(o); err != nil {
			return true, &EnvError{Err: err}
		}
		r, _, err := conform.Repeat(ctx, files, o, f.repeat, seed)
		if err != nil {
			return true, err
		}
		fmt.Fprint(s.Out, r)
		if err := f.write(r); err != nil {
			return true, err
		}
		if len(o.Faults) == 0 {
			// The p-values of a correct dataplane must not be too often
			// small: one-sided KS over every verdict, Holm-corrected.
			ps, names := []float64{r.Pooled.PPlus}, []string{"pooled"}
			for _, v := range r.Verdicts {
				if v.N > 0 {
					ps, names = append(ps, v.PPlus), append(names, v.Name)
				}
			}
			var bad []string
			for i, rej := range stats.Holm(ps, 0.001) {
				if rej {
					bad = append(bad, "p-values too often small: "+names[i])
				}
			}
			if len(bad) > 0 {
				return true, &CheckFailedError{Failed: bad}
			}
		}
		return true, nil
	}
	return false, nil
}

func (f *checkerFlags) write(v any) error {
	if f.out == "" {
		return nil
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(f.out, append(b, '\n'), 0o644)
}
