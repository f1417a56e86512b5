package app

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
	"github.com/kpsim/kpsim/sim/simulate"
)

type runFlags struct {
	out         outputFlag
	seed        uint64
	mode        string
	dir         string
	calibration string
}

func newRun(s Streams) *cobra.Command {
	var f runFlags
	c := &cobra.Command{
		Use:   "run FILE",
		Short: "Simulate a scenario and print its report",
		Long: `run loads and expands the scenario, loads its objects into the cluster model
(client-go fake clientset and informers), then simulates its traffic and events
timeline on a virtual clock in every mode the scenario names (or --mode): rules,
sync times, first-packet work, conntrack, distribution verdicts, affinity,
internalTrafficPolicy Local, and the exposure window of each event. The
scenario's checks are applied to the simulated traffic.

It prints the cluster and the per-mode summary, and writes report.json (the
same seed gives the same bytes), report.md and PNG plots into --out
(default results/<scenario name>/). Exit 1 when a check fails.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if err := f.out.check(); err != nil {
				return err
			}
			var modes []string
			if f.mode != "" {
				if !slices.Contains(scenario.Modes, f.mode) {
					return &UsageError{Err: fmt.Errorf("unknown mode %q (choose from %s)", f.mode, strings.Join(scenario.Modes, ", "))}
				}
				modes = []string{f.mode}
			}
			var seed *uint64
			if c.Flags().Changed("seed") {
				seed = &f.seed
			}
			return runSimulation(s, args[0], seed, modes, f)
		},
	}
	f.out.add(c)
	c.Flags().Uint64Var(&f.seed, "seed", 0, "override the scenario's seed")
	c.Flags().StringVar(&f.mode, "mode", "", "simulate only this mode (iptables, nftables or ipvs)")
	c.Flags().StringVar(&f.dir, "out", "", "folder for report.json, report.md and plots (default results/<scenario name>)")
	c.Flags().StringVar(&f.calibration, "calibration", filepath.Join("results", "calibration"), "folder of sync-time calibrations (sim/cost defaults complete it)")
	return c
}

func runSimulation(s Streams, file string, seed *uint64, modes []string, f runFlags) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	start := time.Now()
	m, err := cluster.Open(ctx, file, seed)
	if err != nil {
		return err
	}
	defer m.Close()
	cals, err := simulate.Calibrations(f.calibration)
	if err != nil {
		return err
	}
	prog := newProgress(s.Err, start)
	r, err := simulate.Run(ctx, m, simulate.Options{Modes: modes, Calibrations: cals, Progress: prog.update})
	prog.done()
	if err != nil {
		return err
	}
	wall := time.Since(start)
	dir := f.dir
	if dir == "" {
		dir = filepath.Join("results", r.Scenario)
	}
	written, err := r.WriteFiles(dir)
	if err != nil {
		return err
	}
	info := s.Out
	if f.out.format == "json" {
		if err := r.WriteJSON(s.Out); err != nil {
			return err
		}
		info = s.Err
	} else {
		if err := r.Cluster.WriteTable(s.Out); err != nil {
			return err
		}
		fmt.Fprintln(s.Out)
		if err := r.WriteTable(s.Out); err != nil {
			return err
		}
		fmt.Fprintln(s.Out)
	}
	var conns int64
	for _, md := range r.Modes {
		conns += md.Connections.Total
	}
	fmt.Fprintf(info, "simulated %d connection(s) in %d mode(s) in %.2f s wall (%.1f million connections/s, loading included); seed %d\n",
		conns, len(r.Modes), wall.Seconds(), float64(conns)/wall.Seconds()/1e6, r.Seed)
	fmt.Fprintf(info, "wrote %s\n", strings.Join(written, ", "))
	if len(r.Failed) > 0 {
		return &CheckFailedError{Failed: r.Failed}
	}
	return nil
}

// progress draws a bar on stderr when stderr is a terminal and the run has
// taken more than a second; otherwise it prints nothing.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	start time.Time
	drawn bool
}

func newProgress(w io.Writer, start time.Time) *progress {
	p := &progress{w: w, start: start}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progress) update(done, total int) {
	if !p.tty || time.Since(p.start) < time.Second {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	const width = 30
	n := done * width / total
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d node runs, %.1f s", strings.Repeat("=", n), strings.Repeat(" ", width-n), done, total, time.Since(p.start).Seconds())
	p.drawn = true
}

func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", 70))
	}
}
