package app

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/nftables"
	"github.com/kpsim/kpsim/harness/conform"
	"github.com/kpsim/kpsim/sim/cluster"
)

func init() { extraCommands = append(extraCommands, newCalibrate) }

type calibrateFlags struct {
	out       outputFlag
	mode      modeFlag
	backends  []string
	layouts   []string
	sizes     []int
	endpoints int
	runs      int
	file      string
	subject   string
	kubeProxy string
	fit       string
	// nftTimeout bounds each nft transaction (0: the size-derived bound).
	nftTimeout time.Duration
}

func newCalibrate(s Streams) *cobra.Command {
	f := calibrateFlags{mode: modeFlag{cluster.ModeIPTables}} // --mode's default
	c := &cobra.Command{
		Use:   "calibrate --mode iptables|nftables",
		Short: "Measure full and partial sync time of the real dataplane at a ladder of sizes (root)",
		Long: `calibrate programs synthetic ClusterIP Services (N x E ready endpoints on one
node) into fresh network namespaces and measures, for each size: a full sync
(render and restore), a partial sync after one endpoint changes, and the raw
iptables-restore of the full sync's exact text, the floor a sync is held to.
Medians of --runs runs. The result is written where the simulator's cost model
reads it (results/calibration/<mode>.json).`,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := f.out.check(); err != nil {
				return err
			}
			if f.fit != "" {
				return writeFits(s.Out, f.fit, f.endpoints)
			}
			if f.mode.m == cluster.ModeIPVS {
				return &EnvError{Err: fmt.Errorf("calibration of ipvs mode is not available in this build (available: iptables, nftables)")}
			}
			if f.subject != conform.SubjectKPSim && f.subject != conform.SubjectKubeProxy {
				return &UsageError{Err: fmt.Errorf("unknown --subject %q: kpsim or kube-proxy", f.subject)}
			}
			if !c.Flags().Changed("write") {
				f.file = "results/calibration/" + string(f.mode.m) + ".json"
				if f.subject == conform.SubjectKubeProxy {
					f.file = "results/calibration/kube-proxy-" + string(f.mode.m) + ".json"
				}
			}
			if os.Geteuid() != 0 {
				return &EnvError{Err: fmt.Errorf("sim calibrate needs root: it creates network namespaces and programs netfilter inside them")}
			}
			if f.runs < 1 || f.endpoints < 1 || len(f.sizes) == 0 {
				return &UsageError{Err: fmt.Errorf("--runs, --endpoints and --sizes must be positive")}
			}
			for _, n := range f.sizes {
				if n < 1 || n > 65000 {
					return &UsageError{Err: fmt.Errorf("size %d out of range 1..65000", n)}
				}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if f.subject == conform.SubjectKubeProxy {
				return calibrateKubeProxy(ctx, s, &f)
			}
			var out []*calibrate.Calibration
			logf := func(format string, a ...any) { fmt.Fprintf(s.Err, format, a...) }
			variants := f.backends
			if f.mode.m == cluster.ModeNFTables {
				variants = f.layouts
			}
			for _, v := range variants {
				var cal *calibrate.Calibration
				var err error
				switch {
				case f.mode.m == cluster.ModeIPTables && (v == "nft" || v == "legacy"):
					cal, err = iptables.Calibrate(ctx, iptables.CalibrateOptions{Variant: v, Sizes: f.sizes, Endpoints: f.endpoints, Runs: f.runs, Log: logf})
				case f.mode.m == cluster.ModeNFTables && (v == "kube-proxy" || v == "fast"):
					cal, err = nftables.Calibrate(ctx, nftables.CalibrateOptions{Layout: nftables.Layout(v), Sizes: f.sizes, Endpoints: f.endpoints, Runs: f.runs, Timeout: f.nftTimeout, Log: logf})
				default:
					return &UsageError{Err: fmt.Errorf("unknown %s variant %q (iptables: --backend nft|legacy; nftables: --layout kube-proxy|fast)", f.mode.m, v)}
				}
				if err != nil {
					return &EnvError{Err: err}
				}
				cal.Kernel = kernelRelease()
				out = append(out, cal)
			}
			if f.file != "" {
				if err := writeCalibration(f.file, out); err != nil {
					return err
				}
			}
			if f.out.format == "json" {
				return writeJSON(s.Out, out)
			}
			for _, cal := range out {
				fmt.Fprintf(s.Out, "%s %s (kernel %s), medians of %d runs\n", cal.Mode, cal.Variant, cal.Kernel, f.runs)
				fmt.Fprintf(s.Out, "%9s %8s %10s %10s %8s %10s %9s\n", "services", "objects", "full s", "raw s", "ratio", "partial s", "partial%")
				for _, p := range cal.Points {
					fmt.Fprintf(s.Out, "%9d %8d %10.3f %10.3f %8.3f %10.4f %8.1f%%\n", p.Services, p.Objects, p.FullSeconds, p.RawRestoreSeconds, p.Ratio, p.PartialSeconds, 100*p.PartialOverFull)
				}
			}
			return nil
		},
	}
	f.out.add(c)
	f.addFlags(c)
	return c
}

func (f *calibrateFlags) addFlags(c *cobra.Command) {
	c.Flags().Var(&f.mode, "mode", "mode to calibrate (iptables)")
	c.Flags().StringSliceVar(&f.backends, "backend", []string{"nft", "legacy"}, "iptables backends to measure")
	c.Flags().StringSliceVar(&f.layouts, "layout", []string{"kube-proxy", "fast"}, "nftables layouts to measure")
	c.Flags().IntSliceVar(&f.sizes, "sizes", []int{500, 1000, 2000, 3000, 5000}, "numbers of Services")
	c.Flags().IntVar(&f.endpoints, "endpoints", 10, "endpoints per Service")
	c.Flags().IntVar(&f.runs, "runs", 5, "runs per size (the median is kept)")
	c.Flags().StringVar(&f.subject, "subject", conform.SubjectKPSim, "what to measure: kpsim (this repository's dataplane) or kube-proxy (the upstream binary's own sync metrics, against a real kube-apiserver; beside ours in results/calibration/README.md)")
	c.Flags().StringVar(&f.kubeProxy, "kube-proxy", "", "with --subject kube-proxy: the kube-proxy binary (default: bin/kube-proxy beside sim)")
	nftTimeoutFlag(c, &f.nftTimeout)
	c.Flags().StringVar(&f.file, "write", "results/calibration/<mode>.json", "file to write ('' to only print)")
	c.Flags().StringVar(&f.fit, "fit", "", "measure nothing: print the cost model fitted to the calibrations in this folder (Markdown; no root needed)")
}

func kernelRelease() string { return conform.KernelRelease() }

// writeCalibration writes a calibration file (indented JSON), its folder
// created when missing.
func writeCalibration(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(v, "", "  ")
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("could not write calibration: %w", err)
	}
	return nil
}
