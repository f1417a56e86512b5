package app

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/remote"
)

func init() { extraCommands = append(extraCommands, newCleanup) }

// geteuid is replaced in tests.
var geteuid = os.Geteuid

type cleanupFlags struct {
	out        outputFlag
	force      bool
	dryRun     bool
	prefix     string
	kubeconfig string
}

func newCleanup(s Streams) *cobra.Command {
	var f cleanupFlags
	c := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove the network namespaces that killed runs left behind",
		Long: `cleanup lists and removes what runs killed before their own teardown left:
named network namespaces under /run/netns whose name starts with kpsim-
(or with --prefix), after killing (SIGKILL) any process still running inside
one (a kube-proxy, etcd or kube-apiserver of a killed run, listed as kind
process); any veth or bridge of ours in the root namespace (there should be
none); the cgroups of local cluster runs (kpsim-RUNID in every cgroup
hierarchy, with the parent folders the run recorded), after killing every
process inside, the pods included; the run folders /tmp/kpsim-RUNID; and
the run markers under /run/kpsim; the state files of local clusters (sim
cluster up) whose supervisor is dead, /run/kpsim/RUNID.cluster.json, with the
kubeconfig it wrote outside the run folder (a live supervisor is killed only
with --force). Only names with our prefix are ever touched.

A run that is still alive holds a lock on its marker /run/kpsim/RUNID.pid;
its namespaces are listed as skipped unless --force.

Needs root (exit 3 otherwise). Exit 0 when everything selected was removed
or skipped; 1 when something could not be removed.

With --kubeconfig it cleans a cluster instead (no root needed): it deletes
the namespaces that sim conform --kubeconfig runs left there (labelled
kpsim.dev/run), except those of a run still alive on this machine (unless
--force), and waits until they are gone (2 minutes at most).`,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := f.out.check(); err != nil {
				return err
			}
			if f.kubeconfig != "" {
				return cleanupCluster(s, &f)
			}
			if !netns.ValidCleanupPrefix(f.prefix) {
				return &UsageError{Err: fmt.Errorf("--prefix %q must be %q or a run prefix %q", f.prefix, netns.Prefix, "kpsim-<runid>-")}
			}
			if geteuid() != 0 {
				return &EnvError{Err: fmt.Errorf("sim cleanup needs root: it removes network namespaces under %s (run it as root, e.g. with sudo)", netns.NetnsDir)}
			}
			states, err := cleanupClusterStates(f.prefix, f.force, f.dryRun)
			if err != nil {
				return &EnvError{Err: err}
			}
			rep, err := netns.Cleanup(netns.CleanupOptions{Prefix: f.prefix, Force: f.force, DryRun: f.dryRun})
			if err != nil {
				return &EnvError{Err: err}
			}
			rep.Items = append(rep.Items, states...)
			if f.out.format == "json" {
				if err := writeJSON(s.Out, rep); err != nil {
					return err
				}
			} else {
				writeCleanupTable(s, rep)
			}
			if n := rep.Failed(); n > 0 {
				return fmt.Errorf("could not remove %d item(s), listed above", n)
			}
			return nil
		},
	}
	f.out.add(c)
	c.Flags().BoolVar(&f.force, "force", false, "also remove the namespaces of runs that are still alive")
	c.Flags().BoolVar(&f.dryRun, "dry-run", false, "list what would be removed, remove nothing")
	c.Flags().StringVar(&f.prefix, "prefix", netns.Prefix, `names to select: "kpsim-" (every run) or one run's "kpsim-<runid>-"`)
	c.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "clean the cluster of this kubeconfig: the namespaces sim conform --kubeconfig runs left there")
	return c
}

// cleanupCluster is sim cleanup --kubeconfig.
func cleanupCluster(s Streams, f *cleanupFlags) error {
	client, err := kubeClient(f.kubeconfig)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var runs []remote.RunNamespace
	if f.dryRun {
		runs, err = remote.Runs(ctx, client)
	} else {
		runs, err = remote.Cleanup(ctx, client, f.force, 2*time.Minute)
	}
	if runs == nil && err != nil {
		return &EnvError{Err: err}
	}
	rep := &netns.CleanupReport{Prefix: remote.LabelRun}
	for _, r := range runs {
		it := netns.Leftover{Kind: "cluster namespace", Name: r.Name, RunID: r.RunID}
		switch {
		case r.Alive && !f.force:
			it.Action = netns.ActionKeptAlive
		case f.dryRun:
			it.Action = netns.ActionWould
		case err != nil:
			it.Action, it.Error = netns.ActionFailed, err.Error()
		default:
			it.Action = netns.ActionRemoved
		}
		rep.Items = append(rep.Items, it)
	}
	if f.out.format == "json" {
		if err := writeJSON(s.Out, rep); err != nil {
			return err
		}
	} else {
		writeCleanupTable(s, rep)
	}
	if err != nil {
		return err
	}
	return nil
}

func writeCleanupTable(s Streams, rep *netns.CleanupReport) {
	if len(rep.Items) == 0 {
		fmt.Fprintf(s.Out, "nothing to clean up (prefix %s)\n", rep.Prefix)
		return
	}
	w := tabwriter.NewWriter(s.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "KIND\tNAME\tRUN\tPID\tACTION")
	counts := map[string]int{}
	for _, it := range rep.Items {
		pid := "-"
		if it.PID != 0 {
			pid = fmt.Sprint(it.PID)
		}
		action := it.Action
		if it.Error != "" {
			action += ": " + it.Error
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", it.Kind, it.Name, it.RunID, pid, action)
		counts[it.Action]++
	}
	w.Flush()
	var parts []string
	for _, p := range []struct {
		n    int
		what string
	}{
		{counts[netns.ActionRemoved], "removed"},
		{counts[netns.ActionWould], "would be removed"},
		{counts[netns.ActionSkipped] + counts[netns.ActionKeptAlive], "skipped (live runs; --force removes them)"},
		{counts[netns.ActionFailed], "failed"},
	} {
		if p.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", p.n, p.what))
		}
	}
	fmt.Fprintln(s.Out, strings.Join(parts, ", "))
}
