package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/harness/conform"
	"github.com/kpsim/kpsim/harness/remote"
	"github.com/kpsim/kpsim/harness/report"
	"github.com/kpsim/kpsim/harness/vm"
	"github.com/kpsim/kpsim/sim/cluster"
)

func init() { extraCommands = append(extraCommands, newConform) }

type conformFlags struct {
	out             outputFlag
	mode            modeFlag
	faults          []string
	seed            uint64
	junit, json, md string
	backend         string
	affinity        string
	layout          string
	nftTimeout      time.Duration
	vm              bool
	vmTimeout       time.Duration
	plots           string
	subject         string
	kubeProxy       string
	dump            string
	remote          remoteFlags
}

func newConform(s Streams) *cobra.Command {
	f := conformFlags{mode: modeFlag{cluster.ModeIPTables}} // --mode's default
	var ck checkerFlags
	c := &cobra.Command{
		Use:   "conform FILE|DIR...",
		Short: "Check the real dataplane with traffic against the oracle (root)",
		Long: `conform builds each scenario's nodes and pods as network namespaces (named
kpsim-<run>-..., removed afterwards; nothing on the host changes), programs the
chosen kube-proxy mode in every node namespace, sends probe connections from the
client pods and decides every check with stated statistics: each is sized at the
first Holm level of the run (family alpha 0.001 by default) for its minimum
detectable effect and power, and the verdicts are Holm-corrected together.

IPVS mode on a kernel without IPVS runs in a qemu microVM booting Debian's
kernel (harness/vm); --vm runs any mode there. The report is the same.

Exit 0 when every check that ran passes, 1 when one fails (the check,
statistic, p, n, seed and an observed-against-expected table are printed), 2
for bad input, 3 when nothing failed but this machine could not run or observe
a check (not root, a command missing, probes the observer lost after the
kernel delivered them, probes that were not independent): what it lacked or
lost is printed. A verdict that tested nothing is reported as not run, with
the reason, and is neither a pass nor a failure.`,
		Args: func(c *cobra.Command, args []string) error {
			if f.remote.printRBAC {
				return cobra.NoArgs(c, args)
			}
			return cobra.MinimumNArgs(1)(c, args)
		},
		RunE: func(c *cobra.Command, args []string) error {
			if f.remote.printRBAC {
				_, err := fmt.Fprint(s.Out, remote.RBAC)
				return err
			}
			return runConform(c, s, &f, &ck, args)
		},
	}
	f.out.add(c)
	f.remote.add(c)
	ck.add(c)
	c.Flags().Var(&f.mode, "mode", "kube-proxy mode to program: iptables, nftables or ipvs")
	c.Flags().StringSliceVar(&f.faults, "fault", nil, "inject a named fault into the dataplane (repeatable): "+fmt.Sprint(proxy.FaultNames()))
	c.Flags().Uint64Var(&f.seed, "seed", 0, "override every scenario's seed")
	c.Flags().StringVar(&f.junit, "junit", "", "write a JUnit XML report to this file")
	c.Flags().StringVar(&f.json, "json", "", "write the JSON report (every figure) to this file")
	c.Flags().StringVar(&f.md, "summary", "", "write a Markdown summary to this file (fits $GITHUB_STEP_SUMMARY)")
	c.Flags().StringVar(&f.backend, "iptables-backend", "", "override the scenarios' iptables backend: nft or legacy")
	c.Flags().StringVar(&f.affinity, "affinity", "", "override the iptables affinity layout: recent (kube-proxy) or ipset (ours)")
	c.Flags().StringVar(&f.layout, "layout", "", "override the nftables layout: kube-proxy or fast (ours)")
	nftTimeoutFlag(c, &f.nftTimeout)
	c.Flags().BoolVar(&f.vm, "vm", false, "run in the qemu microVM (Debian kernel) for any mode; ipvs mode uses it by itself when this kernel has no IPVS")
	c.Flags().DurationVar(&f.vmTimeout, "vm-timeout", 30*time.Minute, "bound on the whole microVM run")
	c.Flags().StringVar(&f.subject, "subject", conform.SubjectKPSim, "the proxy under test: kpsim (this repository's dataplane) or kube-proxy (the upstream binary, against a real kube-apiserver in the run's namespaces; iptables and nftables modes)")
	c.Flags().StringVar(&f.kubeProxy, "kube-proxy", "", "with --subject kube-proxy: the kube-proxy binary to test (default: bin/kube-proxy beside sim, built by make upstream)")
	c.Flags().StringVar(&f.dump, "dump", "", "write, around every check, the client node's rules as the real tools print them (iptables-save -c, nft list ruleset and nft -j, ipvsadm), before and after, the API objects (api.yaml) and manifest.json with the verdicts into this folder (absent or empty): sim diagnose's round-trip data")
	c.Flags().StringVar(&f.plots, "plots", "", "write a PNG per distribution check (observed against expected shares, with their intervals) to this folder")
	// TODO(issue 11): --equivalence DELTA, once conform.Options has
	// Equivalence float64 (the lead's change): o.Equivalence = f.equivalence.
	return c
}

// runConform runs the conform command: the options from the flags, then
// the checkers' run if a checker flag asks for one, else the conformance
// run (here, or in the microVM), its reports and the exit it decides.
func runConform(c *cobra.Command, s Streams, f *conformFlags, ck *checkerFlags, args []string) error {
	if err := f.check(); err != nil {
		return err
	}
	files, err := expandArgs(args)
	if err != nil {
		return err
	}
	if err := f.checkSubject(ck); err != nil {
		return err
	}
	if err := f.remoteConflicts(c, ck); err != nil {
		return err
	}
	if f.dump != "" && (ck.calibrate > 0 || ck.repeat > 0) {
		return &UsageError{Err: fmt.Errorf("--dump writes one run's node dumps: not with --calibrate (no kernel) or --repeat (many runs)")}
	}
	o := conform.Options{Mode: f.mode.m, Subject: f.subject, Faults: f.faults, IPTablesBackend: f.backend, IPTablesAffinity: f.affinity, NFTablesLayout: f.layout, NFTTimeout: f.nftTimeout, Dump: f.dump, Log: stopAt(s.Err)}
	if c.Flags().Changed("seed") {
		o.Seed = &f.seed
	}
	if err := ck.options(&o); err != nil {
		return err
	}
	if err := f.subjectOptions(&o); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	base := uint64(1)
	if o.Seed != nil {
		base = *o.Seed
	}
	if handled, err := ck.run(ctx, s, files, o, base); handled {
		return usageIfFault(err)
	}
	run, err := f.conformRun(ctx, s, files, o)
	if run == nil && err != nil {
		return err
	}
	if werr := f.write(run); werr != nil {
		return werr
	}
	if f.out.format == "json" {
		if err := run.WriteJSON(s.Out); err != nil {
			return err
		}
	} else {
		printRun(s, run)
	}
	return exitFor(run, err)
}

// conformRun runs the scenarios in the microVM (forced, or IPVS mode on a
// kernel without IPVS) or here. It returns the run with the error to carry
// to the exit (an interrupted run), or no run and the command's error when
// there is nothing to report: an environment error (whose report it writes
// all the same, so CI shows why) or a bad fault name.
func (f *conformFlags) conformRun(ctx context.Context, s Streams, files []string, o conform.Options) (*report.Run, error) {
	var run *report.Run
	var err error
	if f.remote.kubeconfig != "" {
		run, err = f.remoteRun(ctx, files, o)
	} else if f.vm || vm.NeedsVM(f.mode.m) {
		run, err = vm.Conform(ctx, files, o, vm.Options{Log: s.Err, Timeout: f.vmTimeout})
	} else {
		run, err = conform.Run(ctx, files, o)
	}
	if err != nil {
		var env *conform.EnvironmentError
		if errors.As(err, &env) {
			r := &report.Run{Mode: string(f.mode.m), Started: time.Now(), Suites: []*report.Suite{{Scenario: "environment", SetupError: env.Error(), SetupErrorKind: report.KindEnvironment}}}
			_ = f.write(r)
			return nil, &EnvError{Err: err}
		}
		if run == nil {
			return nil, usageIfFault(err)
		}
	}
	return run, err
}

// usageIfFault makes an unknown or unbuilt fault a usage error (exit 2).
func usageIfFault(err error) error {
	if errors.Is(err, proxy.ErrUnknownFault) || errors.Is(err, proxy.ErrFaultNotBuilt) || errors.Is(err, conform.ErrDumpDir) {
		return &UsageError{Err: err}
	}
	return err
}

// exitFor decides the exit: a failed check (1) first, then environment
// errors (3), then err (an interrupted run), else success.
func exitFor(run *report.Run, err error) error {
	if failed := run.Failed(); len(failed) > 0 {
		return &CheckFailedError{Failed: failed}
	}
	if env := run.EnvironmentErrors(); len(env) > 0 {
		return &EnvError{Err: fmt.Errorf("%d check(s) could not be observed on this machine (not a dataplane failure): %s", len(env), strings.Join(env, "; "))}
	}
	return err
}

// check validates the flags' values (bad usage: exit 2).
func (f *conformFlags) check() error {
	if err := f.out.check(); err != nil {
		return err
	}
	if _, err := proxy.ParseFaults(f.faults); err != nil {
		return &UsageError{Err: err}
	}
	if f.backend != "" && f.backend != "nft" && f.backend != "legacy" {
		return &UsageError{Err: fmt.Errorf("unknown --iptables-backend %q: nft or legacy", f.backend)}
	}
	if f.layout != "" && f.layout != "kube-proxy" && f.layout != "fast" {
		return &UsageError{Err: fmt.Errorf("unknown --layout %q: kube-proxy or fast", f.layout)}
	}
	if f.affinity != "" && f.affinity != "recent" && f.affinity != "ipset" {
		return &UsageError{Err: fmt.Errorf("unknown --affinity %q: recent or ipset", f.affinity)}
	}
	if f.dump != "" {
		if err := conform.CheckDumpDir(f.dump); err != nil {
			return &UsageError{Err: err}
		}
	}
	return nil
}

// checkSubject validates --subject and what the kube-proxy subject cannot
// run (bad usage: exit 2, naming why).
func (f *conformFlags) checkSubject(ck *checkerFlags) error {
	switch f.subject {
	case conform.SubjectKPSim:
		if f.kubeProxy != "" {
			return &UsageError{Err: fmt.Errorf("--kube-proxy is for --subject kube-proxy")}
		}
		return nil
	case conform.SubjectKubeProxy:
	default:
		return &UsageError{Err: fmt.Errorf("unknown --subject %q: kpsim or kube-proxy", f.subject)}
	}
	why := ""
	switch {
	case f.mode.m == cluster.ModeIPVS:
		why = "--mode ipvs: the kube-proxy subject runs iptables and nftables modes only (no IPVS on this kernel, and its microVM has no control plane)"
	case len(f.faults) > 0:
		why = "--fault: faults are injected into kpsim's dataplane; the upstream binary is run unmodified"
	case f.layout == "fast":
		why = "--layout fast: that is kpsim's own nftables layout; kube-proxy writes its own"
	case f.affinity == "ipset":
		why = "--affinity ipset: that is kpsim's own affinity layout; kube-proxy uses the recent match"
	case ck.calibrate > 0:
		why = "--calibrate: the harness calibration runs on the simulated machine, which models kpsim, not a kube-proxy binary"
	case f.vm:
		why = "--vm: the microVM has no control plane"
	}
	if why != "" {
		return &UsageError{Err: fmt.Errorf("--subject kube-proxy cannot run with %s", why)}
	}
	return nil
}

func (f *conformFlags) write(r *report.Run) error {
	if f.plots != "" {
		if err := r.WritePlots(f.plots); err != nil {
			return err
		}
	}
	for _, w := range []struct {
		path string
		fn   func(*os.File) error
	}{
		{f.junit, func(o *os.File) error { return r.WriteJUnit(o) }},
		{f.json, func(o *os.File) error { return r.WriteJSON(o) }},
		{f.md, func(o *os.File) error { return r.WriteMarkdown(o) }},
	} {
		if w.path == "" {
			continue
		}
		out, err := os.Create(w.path)
		if err != nil {
			return fmt.Errorf("could not write report: %w", err)
		}
		err = w.fn(out)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("could not write %s: %w", w.path, err)
		}
	}
	return nil
}

func printRun(s Streams, r *report.Run) {
	for _, su := range r.Suites {
		if su.SetupError != "" {
			fmt.Fprintf(s.Out, "ERROR %s: setup: %s\n", su.Scenario, su.SetupError)
		}
		for _, c := range su.Checks {
			verdict := "PASS "
			switch {
			case c.Verdict == report.Fail:
				verdict = "FAIL "
			case c.Verdict == report.NotRun:
				verdict = "SKIP "
			case c.Verdict == report.Error && c.ErrorKind == report.KindEnvironment:
				verdict = "ENV  "
			case c.Verdict == report.Error:
				verdict = "ERROR"
			}
			fmt.Fprintf(s.Out, "%s %s / %s  (%s, p %.3g, n %d)\n", verdict, su.Scenario, c.Name, c.Test, c.P, c.N)
			if c.Verdict == report.NotRun {
				fmt.Fprintf(s.Out, "      not run: %s\n", c.Message)
			} else if c.Verdict != report.Pass {
				fmt.Fprint(s.Out, indent(c.Summary()))
			}
		}
		for _, d := range su.Deviations {
			fmt.Fprintf(s.Out, "NOTE  %s: known deviation: %s\n", su.Scenario, d.Evidence)
		}
	}
	failed := r.Failed()
	env := r.EnvironmentErrors()
	ran, notRun := r.Verdicts()
	fmt.Fprintf(s.Out, "\n%s mode, kernel %s, seed %d, family alpha %g: %d verdicts ran, %d not run, %d failed, %d environment errors, %.1f s\n",
		r.Mode, r.Kernel, r.Seed, r.FamilyAlpha, ran, notRun, len(failed), len(env), r.Duration.Seconds())
	if len(env) > 0 {
		fmt.Fprintln(s.Out, "This machine could not run or observe:")
		for _, e := range env {
			fmt.Fprintf(s.Out, "  - %s\n", e)
		}
	}
}

func indent(s string) string {
	out := ""
	for _, line := range splitLines(s) {
		out += "      " + line + "\n"
	}
	return out
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// subjectOptions sets the subject's version (and, for kube-proxy, its
// binaries) in o.
func (f *conformFlags) subjectOptions(o *conform.Options) error {
	if f.subject == conform.SubjectKPSim {
		o.SubjectVersion = Version
		return nil
	}
	bin, err := findUpstream(f.kubeProxy)
	if err != nil {
		return err
	}
	v, err := bin.Version()
	if err != nil {
		return &EnvError{Err: err}
	}
	o.KubeProxy, o.SubjectVersion = bin, v
	return nil
}
