package netns

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

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
// markers of dead runs. Runs whose marker is locked by a live process are
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
	rep := &CleanupReport{Prefix: o.Prefix}
	runs := map[string]RunState{}
	probe := func(id string) (RunState, error) {
		if st, ok := runs[id]; ok {
			return st, nil
		}
		st, err := ProbeRun(id)
		if err != nil {
			return st, err
		}
		runs[id] = st
		return st, nil
	}
	// act decides and, unless dry, removes one item.
	act := func(it Leftover, remove func() error) {
		st, err := probe(it.RunID)
		if err != nil {
			it.Action, it.Error = ActionFailed, err.Error()
			rep.Items = append(rep.Items, it)
			return
		}
		it.PID, it.Alive = st.PID, st.Alive
		switch {
		case st.Alive && !o.Force && o.DryRun:
			it.Action = ActionKeptAlive
		case st.Alive && !o.Force:
			it.Action = ActionSkipped
		case o.DryRun:
			it.Action = ActionWould
		default:
			if err := remove(); err != nil {
				it.Action, it.Error = ActionFailed, err.Error()
			} else {
				it.Action = ActionRemoved
			}
		}
		rep.Items = append(rep.Items, it)
	}

	names, err := listNamespaces(o.Prefix)
	if err != nil {
		return nil, err
	}
	// Pods first, the fabric last, as Close does: a node's links go with it.
	slices.SortFunc(names, func(a, b string) int {
		if d := roleOrder(RoleOf(a)) - roleOrder(RoleOf(b)); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	// A namespace mounted before ip netns add bound NetnsDir on itself
	// is hidden under that mount; uncover it first (see ensureNetnsDir).
	var uncoverErr error
	if !o.DryRun {
		if mounts, err := readMountInfo(); err == nil {
			if hidden, cover := hiddenNamespaces(mounts); len(hidden) > 0 && slices.ContainsFunc(names, func(n string) bool { return slices.Contains(hidden, n) }) {
				if uncoverErr = uncoverNetnsDir(mounts, cover); uncoverErr == nil {
					defer ensureNetnsDir()
				}
			}
		}
	}
	for _, name := range names {
		id, _ := MatchPrefix(name, o.Prefix)
		act(Leftover{Kind: KindNetns, Name: name, RunID: id}, func() error {
			if err := removeNamed(name); err != nil {
				return errors.Join(err, uncoverErr)
			}
			return nil
		})
	}

	links, err := rootLinks(o.Prefix)
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		id, _ := MatchLink(l.Attrs().Name, l.Attrs().AltNames, o.Prefix)
		act(Leftover{Kind: KindLink, Name: l.Attrs().Name, RunID: id}, func() error { return deleteRootLink(l) })
	}

	ids, err := listMarkers()
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if o.Prefix != Prefix && o.Prefix != RunPrefix(id) {
			// A prefix narrower than a whole run selects some of its
			// namespaces; the run's marker stays.
			continue
		}
		if st, err := probe(id); err == nil && st.Alive && !o.Force {
			// A live run's marker is not a leftover: say nothing.
			continue
		}
		act(Leftover{Kind: KindMarker, Name: markerPath(id), RunID: id}, func() error {
			err := os.Remove(markerPath(id))
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		})
	}
	return rep, nil
}

func roleOrder(r Role) int {
	switch r {
	case RoleClient:
		return 0
	case RoleBackend:
		return 1
	case RoleNode:
		return 2
	}
	return 3
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
