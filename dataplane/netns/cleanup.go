package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
)

// CleanupOptions select what Cleanup removes.
type CleanupOptions struct {
	// Prefix selects names: Prefix ("kpsim-", every run; the default) or a
	// run prefix "kpsim-<runid>-" (optionally longer). Anything else is
	// refused.
	Prefix string
	// Force removes the namespaces of runs that are still alive too.
	Force bool
	// DryRun lists without removing.
	DryRun bool
}

// Leftover kinds.
const (
	KindNetns  = "netns"
	KindLink   = "link"
	KindMarker = "marker"
	// KindProcess is a process left running inside a run's namespace
	// (Name: "PID COMM in NAMESPACE"); removing it is SIGKILL.
	KindProcess = "process"
	// KindRunDir is a run's folder (RunDir).
	KindRunDir = "rundir"
	// KindCgroup is a run's cgroup (RunCgroup: a local cluster's daemons
	// and pods), in every hierarchy; removing it kills what runs inside.
	KindCgroup = "cgroup"
)

// Cleanup actions.
const (
	ActionRemoved   = "removed"
	ActionSkipped   = "skipped (run alive)"
	ActionWould     = "would remove"
	ActionFailed    = "failed"
	ActionKeptAlive = "would skip (run alive)"
)

// Leftover is one thing Cleanup found.
type Leftover struct {
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	RunID  string `json:"runID"`
	PID    int    `json:"pid,omitempty"`
	Alive  bool   `json:"alive"`
	Action string `json:"action"`
	Error  string `json:"error,omitempty"`
}

// CleanupReport lists what Cleanup found and did, in a stable order.
type CleanupReport struct {
	Prefix string     `json:"prefix"`
	Items  []Leftover `json:"items"`
}

// Failed counts the items that could not be removed.
func (r *CleanupReport) Failed() int {
	n := 0
	for _, it := range r.Items {
		if it.Action == ActionFailed {
			n++
		}
	}
	return n
}

// Cleanup removes what runs left behind: every named namespace under
// NetnsDir whose name starts with the prefix and is ours (ParseName), every
// veth or bridge in the root namespace whose name or alternative name is ours
// (there should never be one: links are created inside namespaces), and the
// markers and run folders (RunDir) of dead runs; processes still running
// inside a selected namespace are killed first (SIGKILL). Runs whose marker is locked by a live process are
// skipped unless Force. Nothing without our prefix is ever touched.
//
// An error is returned only when Cleanup could not look (options, listing);
// items that could not be removed are reported with ActionFailed.
func Cleanup(o CleanupOptions) (*CleanupReport, error) {
	if o.Prefix == "" {
		o.Prefix = Prefix
	}
	if !ValidCleanupPrefix(o.Prefix) {
		return nil, fmt.Errorf("could not clean up: prefix %q is neither %q nor a run prefix %q", o.Prefix, Prefix, "kpsim-<runid>-")
	}
	c := &cleaner{o: o, rep: &CleanupReport{Prefix: o.Prefix}, runs: map[string]RunState{}}
	names, err := listNamespaces(o.Prefix)
	if err != nil {
		return nil, err
	}
	uncovered, uncoverErr := c.uncover(names)
	if uncovered {
		defer ensureNetnsDir()
	}
	if err := c.cgroups(); err != nil {
		return nil, err
	}
	if err := c.processes(names); err != nil {
		return nil, err
	}
	c.namespaces(names, uncoverErr)
	if err := c.links(); err != nil {
		return nil, err
	}
	if err := c.runDirs(); err != nil {
		return nil, err
	}
	if err := c.markers(); err != nil {
		return nil, err
	}
	return c.rep, nil
}

// cleaner is one Cleanup: its options, its report so far, and the runs it
// has probed.
type cleaner struct {
	o    CleanupOptions
	rep  *CleanupReport
	runs map[string]RunState
}

// probe is ProbeRun, once per run.
func (c *cleaner) probe(id string) (RunState, error) {
	if st, ok := c.runs[id]; ok {
		return st, nil
	}
	st, err := ProbeRun(id)
	if err != nil {
		return st, err
	}
	c.runs[id] = st
	return st, nil
}

// act decides and, unless dry, removes one item.
func (c *cleaner) act(it Leftover, remove func() error) {
	st, err := c.probe(it.RunID)
	if err != nil {
		it.Action, it.Error = ActionFailed, err.Error()
		c.rep.Items = append(c.rep.Items, it)
		return
	}
	it.PID, it.Alive = st.PID, st.Alive
	switch {
	case st.Alive && !c.o.Force && c.o.DryRun:
		it.Action = ActionKeptAlive
	case st.Alive && !c.o.Force:
		it.Action = ActionSkipped
	case c.o.DryRun:
		it.Action = ActionWould
	default:
		if err := remove(); err != nil {
			it.Action, it.Error = ActionFailed, err.Error()
		} else {
			it.Action = ActionRemoved
		}
	}
	c.rep.Items = append(c.rep.Items, it)
}

// uncover: a namespace mounted before ip netns add bound NetnsDir on itself
// is hidden under that mount; uncover it first (see ensureNetnsDir) when one
// of names is hidden and this is no dry run. uncovered says the caller must
// restore NetnsDir when done; err is why uncovering failed.
func (c *cleaner) uncover(names []string) (uncovered bool, err error) {
	if c.o.DryRun {
		return false, nil
	}
	mounts, merr := readMountInfo()
	if merr != nil {
		return false, nil
	}
	hidden, cover := hiddenNamespaces(mounts)
	if len(hidden) == 0 || !slices.ContainsFunc(names, func(n string) bool { return slices.Contains(hidden, n) }) {
		return false, nil
	}
	if err := uncoverNetnsDir(mounts, cover); err != nil {
		return false, err
	}
	return true, nil
}

// namespaces removes the named namespaces: pods first, the fabric last, as
// Close does (a node's links go with it). uncoverErr joins each failure.
func (c *cleaner) namespaces(names []string, uncoverErr error) {
	slices.SortFunc(names, func(a, b string) int {
		if d := roleOrder(RoleOf(a)) - roleOrder(RoleOf(b)); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	for _, name := range names {
		id, _ := MatchPrefix(name, c.o.Prefix)
		c.act(Leftover{Kind: KindNetns, Name: name, RunID: id}, func() error {
			if err := removeNamed(name); err != nil {
				return errors.Join(err, uncoverErr)
			}
			return nil
		})
	}
}

// processes kills what still runs inside the selected namespaces before
// they are removed: a namespace whose name goes lives on while a process
// holds it, and so would the process (a kube-proxy, an apiserver).
func (c *cleaner) processes(names []string) error {
	for _, name := range names {
		id, _ := MatchPrefix(name, c.o.Prefix)
		// A live run's processes are the run's own (its threads enter its
		// namespaces): not leftovers; its namespaces are reported skipped.
		if st, err := c.probe(id); err == nil && st.Alive && !c.o.Force {
			continue
		}
		procs, err := ProcessesIn(filepath.Join(NetnsDir, name))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return err
		}
		for _, p := range procs {
			it := Leftover{Kind: KindProcess, Name: fmt.Sprintf("%d %s in %s", p.PID, p.Comm, name), RunID: id}
			c.act(it, func() error { return KillProcesses([]Process{p}) })
		}
	}
	return nil
}

// cgroups kills what runs in the selected runs' cgroups and removes them,
// with the parents each run recorded. A local cluster's pods run in
// network namespaces of their own, which processes cannot see; their
// cgroups find them. Runs the prefix selects whole only.
func (c *cleaner) cgroups() error {
	hs, err := hierarchies()
	if err != nil {
		return nil // no cgroup mounted: nothing of ours either
	}
	found := findRunCgroups(hs, c.o.Prefix)
	ids := make([]string, 0, len(found))
	for id := range found {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		rc := &RunCgroup{Path: found[id], Hierarchies: hs, record: cgroupRecord(id)}
		c.act(Leftover{Kind: KindCgroup, Name: rc.Path, RunID: id}, func() error {
			if err := rc.Kill(30 * time.Second); err != nil {
				return err
			}
			return rc.Remove()
		})
	}
	return nil
}

// runDirs removes the RunDir of each run the prefix selects whole.
func (c *cleaner) runDirs() error {
	ids, err := listRunDirs()
	if err != nil {
		return err
	}
	for _, id := range ids {
		if c.o.Prefix != Prefix && c.o.Prefix != RunPrefix(id) {
			continue
		}
		c.act(Leftover{Kind: KindRunDir, Name: RunDir(id), RunID: id}, func() error {
			return os.RemoveAll(RunDir(id))
		})
	}
	return nil
}

// links removes our links in the root namespace.
func (c *cleaner) links() error {
	links, err := rootLinks(c.o.Prefix)
	if err != nil {
		return err
	}
	for _, l := range links {
		id, _ := MatchLink(l.Attrs().Name, l.Attrs().AltNames, c.o.Prefix)
		c.act(Leftover{Kind: KindLink, Name: l.Attrs().Name, RunID: id}, func() error { return deleteRootLink(l) })
	}
	return nil
}

// markers removes the markers of dead runs the prefix selects whole.
func (c *cleaner) markers() error {
	ids, err := listMarkers()
	if err != nil {
		return err
	}
	for _, id := range ids {
		if c.o.Prefix != Prefix && c.o.Prefix != RunPrefix(id) {
			// A prefix narrower than a whole run selects some of its
			// namespaces; the run's marker stays.
			continue
		}
		if st, err := c.probe(id); err == nil && st.Alive && !c.o.Force {
			// A live run's marker is not a leftover: say nothing.
			continue
		}
		c.act(Leftover{Kind: KindMarker, Name: markerPath(id), RunID: id}, func() error {
			err := os.Remove(markerPath(id))
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		})
	}
	return nil
}

func roleOrder(r Role) int {
	switch r {
	case RoleClient, RoleOutside:
		return 0
	case RoleBackend:
		return 1
	case RoleNode:
		return 2
	case RoleControlPlane, RoleRouter:
		return 3
	}
	return 4
}

// listNamespaces returns the names under NetnsDir that are ours and match
// prefix.
func listNamespaces(prefix string) ([]string, error) {
	ents, err := os.ReadDir(NetnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("could not list %s: %w", NetnsDir, err)
	}
	var out []string
	for _, e := range ents {
		if _, ok := MatchPrefix(e.Name(), prefix); ok {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// rootLinks lists the veths and bridges of the process's (root) namespace
// that are ours and match prefix. It only reads.
func rootLinks(prefix string) ([]netlink.Link, error) {
	var links []netlink.Link
	err := Do(hostNS, func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return err
		}
		defer h.Close()
		links, err = h.LinkList()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("could not list the root namespace's links: %w", err)
	}
	var out []netlink.Link
	for _, l := range links {
		if t := l.Type(); t != "veth" && t != "bridge" {
			continue
		}
		if _, ok := MatchLink(l.Attrs().Name, l.Attrs().AltNames, prefix); ok {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b netlink.Link) int { return strings.Compare(a.Attrs().Name, b.Attrs().Name) })
	return out, nil
}

// deleteRootLink deletes one of our links from the root namespace. Only
// links that MatchLink selected get here. Equivalent to `ip link del NAME`.
func deleteRootLink(l netlink.Link) error {
	return Do(hostNS, func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return err
		}
		defer h.Close()
		if err := h.LinkDel(l); err != nil {
			return fmt.Errorf("could not delete link %s: %w", l.Attrs().Name, err)
		}
		return nil
	})
}
