package app

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/ipvs"
	"github.com/kpsim/kpsim/dataplane/nftables"
	"github.com/kpsim/kpsim/harness/conform"
	"github.com/kpsim/kpsim/harness/vm"
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
	vm        bool
	vmTimeout time.Duration
	refVM     string
	refHost   string
	fit       string
	shape     string
	// nftTimeout bounds each nft transaction (0: the size-derived bound).
	nftTimeout time.Duration
}

func newCalibrate(s Streams) *cobra.Command {
	f := calibrateFlags{mode: modeFlag{cluster.ModeIPTables}} // --mode's default
	c := &cobra.Command{
		Use:   "calibrate --mode iptables|nftables|ipvs",
		Short: "Measure full and partial sync time of the real dataplane at a ladder of sizes (root)",
		Long: `calibrate programs synthetic ClusterIP Services (N x E ready endpoints on one
node) into fresh network namespaces and measures, for each size: a full sync
(render and restore), a partial sync after one endpoint changes, and the raw
iptables-restore of the full sync's exact text, the floor a sync is held to.
Medians of --runs runs. The result is written where the simulator's cost model
reads it (results/calibration/<mode>.json).

IPVS mode has no partial sync in kube-proxy: its second figure is a full
resync after the endpoint change, which the cost model takes as a
steady-state sync (and this repository's incremental sync is recorded beside
it); there is no raw floor. On a kernel without IPVS it runs
in the microVM of harness/vm (--vm forces the VM for any mode). Under TCG
the VM's CPU is emulated: --reference-vm and --reference-host name the same
calibration (one mode and variant, e.g. --mode nftables --layout fast)
measured in the VM and on the host, and their ratio, size by size, is
written as the calibration's emulation.`,
		RunE: func(c *cobra.Command, _ []string) error {
			if f.fit != "" {
				if err := f.out.check(); err != nil {
					return err
				}
				return writeFits(s.Out, f.fit, f.endpoints)
			}
			if err := f.check(c); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if f.subject == conform.SubjectKubeProxy {
				return calibrateKubeProxy(ctx, s, &f)
			}
			var out []*calibrate.Calibration
			var err error
			if f.vm || vm.NeedsVM(f.mode.m) {
				out, err = calibrateInVM(ctx, s, &f)
			} else {
				out, err = calibrateHere(ctx, s, &f)
			}
			if err != nil {
				return err
			}
			if f.refVM != "" {
				if err := applyEmulation(s, &f, out); err != nil {
					return err
				}
			}
			if f.file != "" {
				if err := writeCalibration(f.file, out); err != nil {
					return err
				}
			}
			if f.out.format == "json" {
				return writeJSON(s.Out, out)
			}
			printCalibration(s, out, f.runs)
			return nil
		},
	}
	f.out.add(c)
	c.Flags().Var(&f.mode, "mode", "mode to calibrate (iptables, nftables, ipvs)")
	c.Flags().StringSliceVar(&f.backends, "backend", []string{"nft", "legacy"}, "iptables backends to measure (ipvs: the one applying its constant rules, default nft)")
	c.Flags().StringSliceVar(&f.layouts, "layout", []string{"kube-proxy", "fast"}, "nftables layouts to measure")
	c.Flags().IntSliceVar(&f.sizes, "sizes", []int{500, 1000, 2000, 3000, 5000}, "numbers of Services")
	c.Flags().IntVar(&f.endpoints, "endpoints", 10, "endpoints per Service")
	c.Flags().IntVar(&f.runs, "runs", 5, "runs per size (the median is kept)")
	c.Flags().StringVar(&f.subject, "subject", conform.SubjectKPSim, "what to measure: kpsim (this repository's dataplane) or kube-proxy (the upstream binary's own sync metrics, against a real kube-apiserver; beside ours in results/calibration/README.md)")
	c.Flags().StringVar(&f.kubeProxy, "kube-proxy", "", "with --subject kube-proxy: the kube-proxy binary (default: bin/kube-proxy beside sim)")
	c.Flags().StringVar(&f.file, "write", "results/calibration/<mode>.json", "file to write ('' to only print)")
	c.Flags().BoolVar(&f.vm, "vm", false, "measure in the qemu microVM (harness/vm; automatic for ipvs on a kernel without IPVS)")
	c.Flags().DurationVar(&f.vmTimeout, "vm-timeout", 30*time.Minute, "bound on the whole microVM run")
	c.Flags().StringVar(&f.refVM, "reference-vm", "", "a calibration of one mode and variant measured in the VM (with --reference-host: their ratio becomes the emulation)")
	c.Flags().StringVar(&f.refHost, "reference-host", "", "the same calibration measured on the host")
	c.Flags().StringVar(&f.shape, "shape", calibrate.ShapeClusterIP, "the Services measured: cluster-ip (ClusterIP only: the cost model's calibrations) or external (every tenth a LoadBalancer with a node port, an external IP and a load-balancer IP; half of those with source ranges, half externalTrafficPolicy Local); iptables and nftables, ours and --subject kube-proxy alike; another shape than cluster-ip writes nothing unless --write says where")
	c.Flags().StringVar(&f.fit, "fit", "", "measure nothing: print the cost model fitted to the calibrations in this folder (Markdown; no root needed)")
	nftTimeoutFlag(c, &f.nftTimeout)
	return c
}

// check validates the flags (usage errors, exit 2) and the environment
// (exit 3), and fills in the defaults that depend on the mode.
func (f *calibrateFlags) check(c *cobra.Command) error {
	if err := f.out.check(); err != nil {
		return err
	}
	if f.subject != conform.SubjectKPSim && f.subject != conform.SubjectKubeProxy {
		return &UsageError{Err: fmt.Errorf("unknown --subject %q: kpsim or kube-proxy", f.subject)}
	}
	if f.mode.m == cluster.ModeIPVS && f.subject == conform.SubjectKubeProxy {
		return &UsageError{Err: fmt.Errorf("--subject kube-proxy calibrates iptables and nftables only (not ipvs)")}
	}
	if f.vm && f.subject == conform.SubjectKubeProxy {
		return &UsageError{Err: fmt.Errorf("--vm measures this repository's dataplane only: not with --subject kube-proxy")}
	}
	if (f.refVM == "") != (f.refHost == "") {
		return &UsageError{Err: fmt.Errorf("--reference-vm and --reference-host go together")}
	}
	if f.refVM != "" && !f.vm && !vm.NeedsVM(f.mode.m) {
		return &UsageError{Err: fmt.Errorf("--reference-vm and --reference-host correct a calibration measured in the VM: add --vm")}
	}
	if f.mode.m == cluster.ModeIPVS {
		if !c.Flags().Changed("backend") {
			f.backends = []string{ipvs.VariantNFT}
		}
		if len(f.backends) != 1 || (f.backends[0] != ipvs.VariantNFT && f.backends[0] != ipvs.VariantLegacy) {
			return &UsageError{Err: fmt.Errorf("--mode ipvs takes one --backend (nft or legacy) for its constant iptables rules, not %q", strings.Join(f.backends, ","))}
		}
	}
	if err := calibrate.CheckShape(f.shape, f.sizes); err != nil {
		return &UsageError{Err: fmt.Errorf("--shape: %w", err)}
	}
	if f.shape != calibrate.ShapeClusterIP && f.mode.m == cluster.ModeIPVS {
		return &UsageError{Err: fmt.Errorf("--shape %s is measured in iptables and nftables modes, not ipvs", f.shape)}
	}
	if !c.Flags().Changed("write") {
		f.file = "results/calibration/" + string(f.mode.m) + ".json"
		if f.subject == conform.SubjectKubeProxy {
			f.file = "results/calibration/kube-proxy-" + string(f.mode.m) + ".json"
		}
		if f.shape != calibrate.ShapeClusterIP {
			f.file = "" // not the cost model's shape: printed only
		}
	}
	if f.runs < 1 || f.endpoints < 1 || len(f.sizes) == 0 {
		return &UsageError{Err: fmt.Errorf("--runs, --endpoints and --sizes must be positive")}
	}
	for _, n := range f.sizes {
		if n < 1 || n > 65000 {
			return &UsageError{Err: fmt.Errorf("size %d out of range 1..65000", n)}
		}
	}
	if f.refVM != "" {
		// Read now: a bad reference is bad input before an hour of runs.
		var refs [2]*calibrate.Calibration
		for i, p := range []string{f.refVM, f.refHost} {
			r, err := readReference(p)
			if err != nil {
				return err
			}
			refs[i] = r
		}
		if refs[0].Mode != refs[1].Mode || refs[0].Variant != refs[1].Variant {
			return &UsageError{Err: fmt.Errorf("the references differ: %s/%s in %s, %s/%s in %s; the ratio compares one calibration on both sides",
				refs[0].Mode, refs[0].Variant, f.refVM, refs[1].Mode, refs[1].Variant, f.refHost)}
		}
	}
	if f.vm && vm.InVM() {
		return &UsageError{Err: fmt.Errorf("--vm inside the kpsim VM: refusing to start another")}
	}
	// The VM's guest runs as its own root; here root is for namespaces.
	if os.Geteuid() != 0 && !f.vm && !vm.NeedsVM(f.mode.m) {
		return &EnvError{Err: fmt.Errorf("sim calibrate needs root: it creates network namespaces and programs netfilter inside them")}
	}
	return nil
}

// calibrateHere measures on this host's kernel.
func calibrateHere(ctx context.Context, s Streams, f *calibrateFlags) ([]*calibrate.Calibration, error) {
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
			cal, err = iptables.Calibrate(ctx, iptables.CalibrateOptions{Variant: v, Sizes: f.sizes, Endpoints: f.endpoints, Runs: f.runs, Shape: f.shape, Log: logf})
		case f.mode.m == cluster.ModeNFTables && (v == "kube-proxy" || v == "fast"):
			cal, err = nftables.Calibrate(ctx, nftables.CalibrateOptions{Layout: nftables.Layout(v), Sizes: f.sizes, Endpoints: f.endpoints, Runs: f.runs, Timeout: f.nftTimeout, Shape: f.shape, Log: logf})
		case f.mode.m == cluster.ModeIPVS:
			cal, err = ipvs.Calibrate(ctx, ipvs.CalibrateOptions{IPTablesVariant: v, Sizes: f.sizes, Endpoints: f.endpoints, Runs: f.runs, Log: logf})
		default:
			return nil, &UsageError{Err: fmt.Errorf("unknown %s variant %q (iptables: --backend nft|legacy; nftables: --layout kube-proxy|fast)", f.mode.m, v)}
		}
		if err != nil {
			return nil, &EnvError{Err: err}
		}
		cal.Kernel = kernelRelease()
		out = append(out, cal)
	}
	return out, nil
}

func printCalibration(s Streams, out []*calibrate.Calibration, runs int) {
	for _, cal := range out {
		fmt.Fprintf(s.Out, "%s %s (kernel %s), medians of %d runs\n", cal.Mode, cal.Variant, cal.Kernel, runs)
		if cal.Machine != "" {
			fmt.Fprintf(s.Out, "measured in: %s\n", cal.Machine)
		}
		if e := cal.Emulation; e != nil {
			fmt.Fprintf(s.Out, "emulation: VM/host %.2f (%.2f-%.2f): %s\n", e.Ratio, e.Low, e.High, e.Method)
		}
		if cal.Mode == cluster.ModeIPVS {
			fmt.Fprintf(s.Out, "%9s %8s %10s %10s %10s %9s\n", "services", "objects", "full s", "resync s", "incr s", "resync%")
			for _, p := range cal.Points {
				fmt.Fprintf(s.Out, "%9d %8d %10.3f %10.3f %10.4f %8.1f%%\n", p.Services, p.Objects, p.FullSeconds, p.PartialSeconds, p.IncrementalSeconds, 100*p.PartialOverFull)
			}
			continue
		}
		fmt.Fprintf(s.Out, "%9s %8s %10s %10s %8s %10s %9s\n", "services", "objects", "full s", "raw s", "ratio", "partial s", "partial%")
		for _, p := range cal.Points {
			fmt.Fprintf(s.Out, "%9d %8d %10.3f %10.3f %8.3f %10.4f %8.1f%%\n", p.Services, p.Objects, p.FullSeconds, p.RawRestoreSeconds, p.Ratio, p.PartialSeconds, 100*p.PartialOverFull)
		}
	}
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
