package app

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/sim/capacity"
	"github.com/kpsim/kpsim/sim/scenario"
)

func init() { extraCommands = append(extraCommands, newCapacity) }

type capacityFlags struct {
	sizes       string
	slos        []string
	calibration string
	// calibrationSet: --calibration was given (strict: it must exist).
	calibrationSet bool
	output         string
	dir            string
	progress       string
	nodes          string
	eventRate      float64
	seed           uint64
	cpuprofile     string
}

func newCapacity(s Streams) *cobra.Command {
	var f capacityFlags
	c := &cobra.Command{
		Use:   "capacity FILE --sizes 1000,2000,5000,10000,30000 [--slo programming-latency=1s ...]",
		Short: "Scale a scenario to a ladder of Service counts and report what each kube-proxy mode costs a node",
		Long: `capacity takes the scenario's shape (its generate section: endpoints per
Service, affinity and traffic-policy fractions; its node count; its event rate)
and scales it to each size in --sizes, then reports per mode and backend
(iptables nft and legacy, nftables, ipvs), on the node with the most objects:
objects programmed, full and partial sync time from the fitted cost models,
network programming latency p50/p99 under the scaled event rate with
kube-proxy's minSyncPeriod pacing, rules a first packet walks, conntrack
entries and memory, and for each --slo the largest size that meets it.
Every figure outside a calibration's measured range is marked extrapolated,
and so is an SLO answer that rests on one. No traffic is simulated.

--slo: programming-latency=DURATION (p99), full-sync=DURATION,
first-packet-rules=N (p99); repeat the flag for several.
--nodes scaled (default) grows cluster.nodeCount with the Service count so
that pods and traffic per node stay the scenario's; fixed keeps it.
-o table|json|markdown|perfdata (ClusterLoader2 PerfData JSON). With --out DIR
it also writes every format and PNG plots into DIR; without it, no file.
Bad --sizes, --slo or scenario: exit 2.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			o, err := f.options()
			if err != nil {
				return &UsageError{Err: err}
			}
			if c.Flags().Changed("seed") {
				o.Seed = &f.seed
			}
			f.calibrationSet = c.Flags().Changed("calibration")
			return runCapacity(s, args[0], o, f)
		},
	}
	fl := c.Flags()
	fl.StringVar(&f.sizes, "sizes", "1000,2000,5000,10000,30000", "Service counts to scale the scenario to, comma separated")
	fl.StringArrayVar(&f.slos, "slo", nil, "an objective: programming-latency=DUR, full-sync=DUR or first-packet-rules=N (repeatable)")
	fl.StringVar(&f.calibration, "calibration", filepath.Join("results", "calibration"), "folder of sync-time calibrations (sim/cost defaults complete it)")
	fl.StringVarP(&f.output, "output", "o", "table", "output format: table, json, markdown or perfdata")
	fl.StringVar(&f.dir, "out", "", "write capacity.json, capacity.md, capacity.txt, perfdata.json and plots into this folder")
	fl.StringVar(&f.progress, "progress", "auto", "progress on stderr: auto (only when stderr is a terminal), always or never")
	fl.StringVar(&f.nodes, "nodes", capacity.NodesScaled, "node count: scaled with the Service count, or fixed")
	fl.Float64Var(&f.eventRate, "event-rate", 0, "endpoint changes per second at the scenario's own size (default: its events timeline's rate)")
	fl.Uint64Var(&f.seed, "seed", 0, "override the scenario's seed")
	fl.StringVar(&f.cpuprofile, "cpuprofile", "", "write a CPU profile to this file")
	_ = fl.MarkHidden("cpuprofile")
	return c
}

// options checks the flags that need no file.
func (f *capacityFlags) options() (capacity.Options, error) {
	var o capacity.Options
	switch f.output {
	case "table", "json", "markdown", "perfdata":
	default:
		return o, fmt.Errorf("unknown output format %q: use table, json, markdown or perfdata", f.output)
	}
	switch f.progress {
	case "auto", "always", "never":
	default:
		return o, fmt.Errorf("--progress %q: want auto, always or never", f.progress)
	}
	switch f.nodes {
	case capacity.NodesScaled, capacity.NodesFixed:
	default:
		return o, fmt.Errorf("--nodes %q: want scaled or fixed", f.nodes)
	}
	if f.eventRate < 0 {
		return o, fmt.Errorf("--event-rate %g: want a rate of 0 or more", f.eventRate)
	}
	sizes, err := capacity.ParseSizes(f.sizes)
	if err != nil {
		return o, err
	}
	o.Sizes, o.Nodes, o.EventRate = sizes, f.nodes, f.eventRate
	for _, s := range f.slos {
		slo, err := capacity.ParseSLO(s)
		if err != nil {
			return o, err
		}
		o.SLOs = append(o.SLOs, slo)
	}
	return o, nil
}

func runCapacity(s Streams, file string, o capacity.Options, f capacityFlags) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	start := time.Now()
	stopProfile, err := startCPUProfile(f.cpuprofile)
	if err != nil {
		return err
	}
	defer stopProfile()
	l, err := scenario.LoadFile(file)
	if err != nil {
		return err
	}
	printWarnings(s.Err, l.Warnings)
	cals, err := loadCalibrations(f.calibration, f.calibrationSet)
	if err != nil {
		return err
	}
	o.Calibrations = cals
	prog := newProgress(s.Err, start, f.progress)
	prog.unit = "size and mode steps"
	o.Progress = prog.update
	res, err := capacity.Run(ctx, l, o)
	prog.done()
	if err != nil {
		return err
	}
	var written []string
	if f.dir != "" {
		if written, err = res.WriteFiles(f.dir); err != nil {
			return err
		}
	}
	switch f.output {
	case "json":
		err = res.WriteJSON(s.Out)
	case "markdown":
		err = res.WriteMarkdown(s.Out)
	case "perfdata":
		err = res.WritePerfData(s.Out)
	default:
		err = res.WriteTable(s.Out)
	}
	if err != nil {
		return err
	}
	// Run-time facts go to stderr, so that the output is the same for the
	// same input.
	info := s.Err
	fmt.Fprintf(info, "swept %d size(s) x %d mode(s) in %.2f s wall; seed %d\n", len(res.Sizes), len(res.Models), time.Since(start).Seconds(), res.Seed)
	if len(written) > 0 {
		fmt.Fprintf(info, "wrote %s\n", strings.Join(written, ", "))
	}
	return nil
}
