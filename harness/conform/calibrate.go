package conform

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/stats"
	"github.com/kpsim/kpsim/harness/topology"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Calibration is the harness checking itself: whole runs of the suite on a
// correct dataplane, through the run's own code (probe plan, counting,
// sizing, decisions, Holm over the run's m) on the simulated machine, and
// the rate at which they fail, tested against the family alpha with an
// exact binomial test.
type Calibration struct {
	Mode     cluster.Mode `json:"mode"`
	Runs     int          `json:"runs"`
	Verdicts int          `json:"verdictsPerRun"`
	Failed   int          `json:"failedRuns"`
	Errored  int          `json:"erroredRuns"`
	Alpha    float64      `json:"familyAlpha"`
	LossRate float64      `json:"lossRate"`
	// Rate is Failed/Runs with its 99.9 % Clopper-Pearson interval.
	Rate, Low, High float64
	// P is the exact binomial test of "the false-failure rate is at most
	// Alpha" (one-sided, greater).
	P float64 `json:"p"`
	// Probes is the mean number of probes per run.
	Probes float64 `json:"probesPerRun"`
	// FailedVerdicts counts, per verdict name, the runs it failed.
	FailedVerdicts map[string]int `json:"failedVerdicts,omitempty"`
	// Mismatched counts runs whose verdicts (pass or fail, not-run and
	// errors left out) were not the m the run was sized for.
	Mismatched int `json:"mismatchedRuns"`
	// ErrorMessages holds the first few error verdicts.
	ErrorMessages []string `json:"errors,omitempty"`
	Duration      time.Duration
}

// Calibrate runs the scenarios runs times on the simulated machine, with
// seeds seed, seed+1, ..., and lossRate the chance that the observer misses
// a delivered probe.
func Calibrate(ctx context.Context, files []string, o Options, runs int, seed uint64, lossRate float64) (*Calibration, error) {
	o, _, loaded, err := load(files, o)
	if err != nil {
		return nil, err
	}
	if len(o.Faults) > 0 {
		return nil, fmt.Errorf("the calibration runs the correct dataplane: the simulated machine has no faults")
	}
	loaded = simulatedChecks(loaded)
	start := time.Now()
	o.Log = io.Discard // one line per run would drown the result
	c := &Calibration{Mode: o.Mode, Runs: runs, Alpha: o.FamilyAlpha, LossRate: lossRate, FailedVerdicts: map[string]int{},
		Verdicts: plannedVerdicts(loaded, o.Mode, &seed)}
	runsOut := make([]*report.Run, runs)
	one := func(r int) {
		o := o
		sd := seed + uint64(r)
		o.Seed = &sd
		runsOut[r] = execute(ctx, loaded, o, func(ctx context.Context, l *scenario.Loaded, alphaUnit float64, run *report.Run) *report.Suite {
			return simSuite(ctx, l, o, alphaUnit, run, lossRate)
		})
	}
	// The first run alone: it designs every check's sequential test (a
	// Monte Carlo of a second or more for many endpoints), which the others
	// then find in the design cache instead of computing side by side.
	if runs > 0 {
		one(0)
	}
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < calibrationWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range next {
				one(r)
			}
		}()
	}
	for r := 1; r < runs && ctx.Err() == nil; r++ {
		next <- r
	}
	close(next)
	wg.Wait()
	var probes int64
	for _, run := range runsOut {
		if run != nil {
			probes += c.add(run)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.Rate = float64(c.Failed) / float64(runs)
	c.Low, c.High = stats.ClopperPearson(c.Failed, runs, 0.999)
	res, err := stats.BinomialTest(c.Failed, runs, c.Alpha, stats.Greater)
	if err != nil {
		return nil, err
	}
	c.P = res.P
	c.Probes = float64(probes) / float64(runs)
	c.Duration = time.Since(start)
	return c, nil
}

// calibrationWorkers runs simulated runs side by side: most of a run's
// wall time is the cluster model's informers syncing.
const calibrationWorkers = 16

// add counts one run and returns its probes.
func (c *Calibration) add(run *report.Run) int64 {
	var probes int64
	failed, errored := false, false
	ran := 0
	for _, s := range run.Suites {
		if s.SetupError != "" {
			errored = true
			c.note(s.Scenario + ": " + s.SetupError)
		}
		for _, ch := range s.Checks {
			probes += int64(ch.N)
			if (ch.Verdict == report.Pass || ch.Verdict == report.Fail) && ch.Type != typeEquivalence {
				ran++
			}
			switch ch.Verdict {
			case report.Fail:
				failed = true
				c.FailedVerdicts[s.Scenario+"/"+ch.Name]++
			case report.Error:
				errored = true
				c.note(s.Scenario + "/" + ch.Name + ": " + ch.Message)
			}
		}
	}
	if failed {
		c.Failed++
	}
	if errored {
		c.Errored++
	} else if ran != c.Verdicts {
		c.Mismatched++
		c.note(fmt.Sprintf("%d verdicts ran, %d planned", ran, c.Verdicts))
	}
	return probes
}

func (c *Calibration) note(msg string) {
	if len(c.ErrorMessages) < 5 {
		c.ErrorMessages = append(c.ErrorMessages, msg)
	}
}

// String is the calibration in one paragraph.
func (c *Calibration) String() string {
	var worst []string
	for k, v := range c.FailedVerdicts {
		worst = append(worst, fmt.Sprintf("%s (%d)", k, v))
	}
	sort.Strings(worst)
	return fmt.Sprintf("%s: %d of %d simulated runs failed (rate %.5f, 99.9%% CI %.5f-%.5f; family alpha %g; exact binomial p = %.3g that the rate exceeds it), %d errored; %d verdicts per run, %.0f probes per run, loss %g; failed verdicts: %v",
		c.Mode, c.Failed, c.Runs, c.Rate, c.Low, c.High, c.Alpha, c.P, c.Errored, c.Verdicts, c.Probes, c.LossRate, worst)
}

// kernelOnlyTypes are the check types the simulated machine does not model
// (clients outside the cluster or on a node's host, health checks, source
// addresses, endpoint pods, established flows): they run on the kernel only, and the
// calibration leaves them out.
var kernelOnlyTypes = map[string]bool{
	scenario.CheckExternalDistribution: true,
	scenario.CheckExternalLocalBalance: true,
	scenario.CheckExternalAffinity:     true,
	scenario.CheckSourceAddress:        true,
	scenario.CheckHealthCheck:          true,
	scenario.CheckSourceRanges:         true,
	scenario.CheckHairpin:              true,
	scenario.CheckServiceCIDR:          true,
	scenario.CheckUDPFlow:              true,
	scenario.CheckTCPEstablished:       true,
	scenario.CheckAffinityMoves:        true,
}

// simulatedChecks keeps, of each scenario, the checks the simulated machine
// models (a copy), and the scenarios left with one.
func simulatedChecks(loaded []*scenario.Loaded) []*scenario.Loaded {
	var out []*scenario.Loaded
	for _, l := range loaded {
		sc := *l.Scenario
		sc.Checks = slices.DeleteFunc(slices.Clone(sc.Checks), func(c scenario.Check) bool { return kernelOnlyTypes[c.Type] })
		if len(sc.Checks) == 0 {
			continue
		}
		cp := *l
		cp.Scenario = &sc
		out = append(out, &cp)
	}
	return out
}

// simSuite runs one scenario's checks on the simulated machine.
func simSuite(ctx context.Context, l *scenario.Loaded, o Options, alphaUnit float64, run *report.Run, lossRate float64) *report.Suite {
	start := time.Now()
	out := &report.Suite{Scenario: l.Scenario.Metadata.Name, File: l.File, Figures: map[string]any{}}
	s := &suite{o: o, l: l, alphaUnit: alphaUnit, out: out, start: start}
	defer func() { out.Duration = time.Since(start) }()
	m, _, err := s.configure(ctx, run)
	if err != nil {
		out.SetupError = err.Error()
		return out
	}
	defer m.Close()
	id, err := netns.NewRunID()
	if err != nil {
		out.SetupError = err.Error()
		return out
	}
	cfg, err := topology.FromModel(m, id)
	if err != nil {
		out.SetupError = err.Error()
		return out
	}
	var cls []*netns.Client
	for _, n := range cfg.Nodes {
		for _, cc := range n.Clients {
			cls = append(cls, &netns.Client{Config: cc, Node: n.Name})
		}
	}
	mc, err := newSimMachine(s, cls, s.seed, lossRate)
	if err != nil {
		out.SetupError = err.Error()
		return out
	}
	s.mc = mc
	s.runChecks(ctx)
	return out
}
