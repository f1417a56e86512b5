package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/harness/soak"
	"github.com/kpsim/kpsim/sim/scenario"
)

func init() { extraCommands = append(extraCommands, newSoak) }

type soakFlags struct {
	out       outputFlag
	mode      modeFlag
	events    int
	failEvery int
	seed      uint64
	interval  time.Duration
	backend   string
	layout    string
	timeout   time.Duration
}

func newSoak(s Streams) *cobra.Command {
	var f soakFlags
	c := &cobra.Command{
		Use:   "soak FILE --mode iptables|nftables [--events N] [--fail-apply-every K] [--seed S]",
		Short: "Drive N API changes through the real sync loop, then require the kernel to equal a fresh render (root)",
		Long: `soak builds the scenario's nodes as network namespaces (kpsim-<run>-..., removed
afterwards and on SIGINT/SIGTERM; sim cleanup removes what a killed soak left),
runs one tracker and sync loop per node as sim conform does, and writes N seeded
random API changes through the cluster model's clientset: readiness flaps, scale
up and down, endpoint deletions, Service creation and deletion, affinity and
internal traffic policy edits. With --fail-apply-every K every K-th kernel apply
(iptables-restore, nft -f) is made to fail in the real tool.

After the last change it waits until every node has programmed the final
tracker sequence, then requires each node's kernel state (iptables-save or nft
list ruleset, and ipset save; counters ignored) to equal a fresh render of the
final API state applied to a fresh namespace, no leaked chain, set, map element,
ipset or namespace, and an RSS that does not grow with N (last-quarter median
<= first-quarter median x 1.25 + 16 MiB).

Exit 0 when all holds, 1 when something differs, leaks or grows (the diff is
printed), 2 for bad input, 3 when this machine cannot run it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if err := f.out.check(); err != nil {
				return err
			}
			o := soak.Options{Mode: f.mode.m, Events: f.events, FailApplyEvery: f.failEvery, Interval: f.interval,
				IPTablesBackend: f.backend, NFTablesLayout: f.layout, Log: s.Err}
			if c.Flags().Changed("seed") {
				o.Seed = &f.seed
			}
			if err := o.Validate(); err != nil {
				return &UsageError{Err: err}
			}
			if f.timeout <= 0 {
				return &UsageError{Err: fmt.Errorf("--timeout %s: must be positive", f.timeout)}
			}
			// Bad input is reported (file:line:field, exit 2) before the
			// environment is looked at, and nothing is created for it.
			l, err := scenario.LoadFile(args[0])
			if err != nil {
				return err
			}
			if _, err := scenario.Expand(l, o.Seed); err != nil {
				return err
			}
			if geteuid() != 0 {
				return &EnvError{Err: fmt.Errorf("sim soak needs root: it creates network namespaces and programs netfilter inside them (nothing on the host is changed)")}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx, cancel := context.WithTimeout(ctx, f.timeout)
			defer cancel()
			res, err := soak.Run(ctx, args[0], o)
			var env *soak.EnvironmentError
			var ue *soak.UsageError
			switch {
			case errors.As(err, &env):
				return &EnvError{Err: err}
			case errors.As(err, &ue):
				return &UsageError{Err: err}
			case err != nil && errors.Is(err, context.DeadlineExceeded):
				return fmt.Errorf("the soak did not finish within --timeout %s: %w", f.timeout, err)
			case err != nil && errors.Is(err, context.Canceled):
				return fmt.Errorf("the soak was interrupted (its namespaces are removed): %w", err)
			case err != nil:
				return err
			}
			if f.out.format == "json" {
				if err := writeJSON(s.Out, res); err != nil {
					return err
				}
			} else {
				printSoak(s, res)
			}
			if !res.Passed() {
				return &CheckFailedError{Failed: res.Failed}
			}
			return nil
		},
	}
	f.out.add(c)
	c.Flags().Var(&f.mode, "mode", "kube-proxy mode to program: iptables or nftables (required)")
	c.Flags().IntVar(&f.events, "events", 2000, "number of API changes (N)")
	c.Flags().IntVar(&f.failEvery, "fail-apply-every", 0, "make every K-th kernel apply fail in the real tool (0: never; at least 2)")
	c.Flags().Uint64Var(&f.seed, "seed", 0, "override the scenario's seed (the changes are reproducible from it)")
	c.Flags().DurationVar(&f.interval, "interval", 10*time.Millisecond, "mean pause between two changes (each drawn uniformly from [0, 2x))")
	c.Flags().StringVar(&f.backend, "iptables-backend", "", "override the scenario's iptables backend: nft or legacy")
	c.Flags().StringVar(&f.layout, "layout", "", "override the nftables layout: kube-proxy or fast")
	c.Flags().DurationVar(&f.timeout, "timeout", 30*time.Minute, "bound on the whole soak")
	return c
}

func printSoak(s Streams, r *soak.Result) {
	// The table shows the start of each node's diff and of the leaks;
	// -o json has the first soak.MaxDiffShown diff lines per node and
	// every leak.
	const shown = 20
	for _, n := range r.PerNode {
		for _, l := range n.Diff[:min(len(n.Diff), shown)] {
			fmt.Fprintf(s.Out, "DIFF  %s: %s\n", n.Name, l)
		}
		if n.DiffLines > shown {
			fmt.Fprintf(s.Out, "DIFF  %s: ... %d more line(s) (-o json has the first %d)\n", n.Name, n.DiffLines-shown, soak.MaxDiffShown)
		}
		if r.Passed() {
			continue // injected failures that recovered: figures below
		}
		for _, e := range n.SyncErrors[:min(len(n.SyncErrors), 3)] {
			fmt.Fprintf(s.Out, "SYNC  %s: %s\n", n.Name, strings.ReplaceAll(strings.TrimSpace(e), "\n", " | "))
		}
	}
	for _, l := range r.Leaks[:min(len(r.Leaks), shown)] {
		fmt.Fprintf(s.Out, "LEAK  %s\n", l)
	}
	if len(r.Leaks) > shown {
		fmt.Fprintf(s.Out, "LEAK  ... %d more (-o json lists every one)\n", len(r.Leaks)-shown)
	}
	w := tabwriter.NewWriter(s.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tSYNCS\tFULL\tPARTIAL\tFAILED\tRECOVERIES\tDUMP LINES\tDIFF LINES")
	for _, n := range r.PerNode {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", n.Name, n.Syncs, n.FullSyncs, n.PartialSyncs, n.FailedSyncs, n.Recoveries, n.DumpLines, n.DiffLines)
	}
	w.Flush()
	var kinds []string
	for _, k := range soak.Kinds() {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, r.Changes[k]))
	}
	fmt.Fprintf(s.Out, "\nchanges: %s\n", strings.Join(kinds, ", "))
	verdict := "PASS"
	if !r.Passed() {
		verdict = "FAIL"
	}
	fmt.Fprintf(s.Out, "%s %s mode (%s), %s, seed %d: %d events (%d API writes, Services %d -> %d), %d syncs, %d failures injected (of %d applies), %d recoveries, %d final diff lines, %d leaks, peak RSS %.1f MiB (first/last quarter median %.1f/%.1f MiB, limit %.1f), %.1f s (changes %.1f s, settle %.2f s)\n",
		verdict, r.Mode, r.Variant, r.Scenario, r.Seed, r.Events, r.Writes, r.ServicesStart, r.ServicesEnd, r.Syncs, r.FailuresInjected, r.Applies,
		r.Recoveries, r.DiffLines, len(r.Leaks), r.RSS.PeakMiB, r.RSS.FirstQuarterMiB, r.RSS.LastQuarterMiB, r.RSS.LimitMiB,
		r.WallSeconds, r.EventSeconds, r.SettleSeconds)
	for _, f := range r.Failed {
		fmt.Fprintf(s.Out, "FAIL  %s\n", f)
	}
}
