// Package calibrate measures the real dataplane's sync time against size:
// for each size, in fresh namespaces, a full sync, a partial sync after one
// endpoint changes, and the raw load of the full sync's exact text (the floor
// a sync is held to). Each backend supplies a Target (its own Calibrate
// wrapper); Synthetic builds the Services measured. The results are the file
// the simulator's cost model reads (sim/cost).
package calibrate

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
)

// Point is one measured size, in the JSON shape the simulator's
// cost model reads (sim/cost.Point), plus the raw-restore comparison.
type Point struct {
	Services            int     `json:"services"`
	EndpointsPerService int     `json:"endpointsPerService"`
	Objects             int     `json:"objects"`
	FullSeconds         float64 `json:"fullSyncSeconds"`
	PartialSeconds      float64 `json:"partialSyncSeconds,omitempty"`
	// RawRestoreSeconds is the raw load of the full sync's exact text into
	// a fresh namespace (`iptables-restore --noflush`, `nft -f`): the floor
	// a sync is held to.
	RawRestoreSeconds float64 `json:"rawRestoreSeconds"`
	Ratio             float64 `json:"fullOverRaw"`
	PartialOverFull   float64 `json:"partialOverFull"`
	RestoreBytes      int     `json:"restoreBytes"`
	Runs              int     `json:"runs"`
	// IncrementalSeconds is, for a target whose second figure is a full
	// resync (Target.ResyncFull), this repository's incremental sync of
	// the same one-endpoint change: what a proxier that diffs could pay.
	IncrementalSeconds float64 `json:"incrementalSyncSeconds,omitempty"`
}

// Calibration is sync time against size for one variant.
type Calibration struct {
	// Emulation is set when the points were measured on an emulated CPU
	// (the microVM under TCG): the VM/host ratio of a reference
	// calibration (sim/cost.Emulation).
	Emulation *cost.Emulation `json:"emulation,omitempty"`
	Mode      cluster.Mode    `json:"mode"`
	Variant   string          `json:"variant"`
	Kernel    string          `json:"kernel,omitempty"`
	// Machine says where the points were measured when not on this host's
	// kernel, e.g. "qemu microVM, TCG, 2 vCPUs, 1024 MB".
	Machine string  `json:"machine,omitempty"`
	Source  string  `json:"source"`
	Points  []Point `json:"points"`
}

// Median is the median of v (the upper one for an even count).
func Median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// Target is what differs between modes when measuring syncs: how
// to program a namespace, and how to load a text raw into one.
type Target struct {
	Mode    cluster.Mode
	Variant string
	// NewBackend returns a backend programming ns.
	NewBackend func(ns *netns.Namespace) (dataplane.Backend, error)
	// Text returns the exact text the full sync of st sends; it is called
	// right after that sync, with its backend.
	Text func(b dataplane.Backend, st *cluster.State) (string, error)
	// Raw returns the command that loads text raw (it reads stdin); nil
	// when the mode has no single text to load (IPVS: netlink, ipsets
	// and a constant iptables set), and then Text may be nil too.
	Raw func(ctx context.Context) *exec.Cmd
	// PrepareRaw, when set, readies the raw load's fresh namespace with
	// what the backend creates before its first sync outside the text
	// (iptables: kube-proxy's nfacct counters, which the text matches).
	PrepareRaw func(ns *netns.Namespace) error
	// ResyncFull makes the second figure a full resync after the one
	// endpoint change (kube-proxy's IPVS proxier has one kind of sync: it
	// rebuilds every ipset and queries every virtual server each time; the
	// cost model takes this figure as its steady-state sync);
	// this repository's incremental sync is then measured too
	// (Point.IncrementalSeconds).
	ResyncFull bool
	// Synthetic builds n Services of k ready endpoints on node "node-1".
	Synthetic func(n, k int) *cluster.State
	// Source is the command recorded (default "sim calibrate --mode M").
	Source string
}

// Run measures, for each size, in fresh namespaces: a full sync, a
// partial sync after one endpoint changes, and the raw load of the full
// sync's exact text; medians of runs.
func Run(ctx context.Context, t Target, sizes []int, endpoints, runs int, log func(string, ...any)) (*Calibration, error) {
	out := &Calibration{Mode: t.Mode, Variant: t.Variant, Source: t.Source}
	if out.Source == "" {
		out.Source = "sim calibrate --mode " + string(t.Mode)
	}
	for _, n := range sizes {
		st := t.Synthetic(n, endpoints)
		var full, partial, raw, incr []float64
		var bytesN, objects int
		for r := 0; r < runs; r++ {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			m, err := measureOnce(ctx, t, st)
			if err != nil {
				return nil, err
			}
			full, partial, raw, incr = append(full, m.full), append(partial, m.partial), append(raw, m.raw), append(incr, m.incremental)
			bytesN, objects = m.bytes, m.objects
			runtime.GC()
		}
		pt := Point{Services: n, EndpointsPerService: endpoints, Objects: objects, FullSeconds: Median(full),
			PartialSeconds: Median(partial), RawRestoreSeconds: Median(raw), RestoreBytes: bytesN, Runs: runs}
		if t.ResyncFull {
			pt.IncrementalSeconds = Median(incr)
		}
		if pt.RawRestoreSeconds > 0 {
			pt.Ratio = pt.FullSeconds / pt.RawRestoreSeconds
		}
		pt.PartialOverFull = pt.PartialSeconds / pt.FullSeconds
		if log != nil {
			log("%s-%s %5d services x %d: full %.3fs (raw %.3fs, ratio %.3f), partial %.4fs (%.2f%% of full), %d objects\n",
				t.Mode, t.Variant, n, endpoints, pt.FullSeconds, pt.RawRestoreSeconds, pt.Ratio, pt.PartialSeconds, 100*pt.PartialOverFull, objects)
		}
		out.Points = append(out.Points, pt)
	}
	return out, nil
}

type measurement struct {
	full, partial, raw, incremental float64
	bytes, objects                  int
}

// oneNode builds a topology of a single node namespace (no pods).
func oneNode(ctx context.Context) (*netns.Topology, *netns.Namespace, error) {
	id, err := netns.NewRunID()
	if err != nil {
		return nil, nil, err
	}
	cfg := &netns.Config{RunID: id, Nodes: []netns.NodeConfig{{Name: "node-1", Addr: netip.MustParsePrefix("198.18.0.1/16"),
		PodCIDR: netip.MustParsePrefix("10.128.0.0/24"), Gateway: netip.MustParseAddr("10.128.0.1")}}}
	t, err := netns.Build(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return t, t.Nodes()[0].NS, nil
}

func measureOnce(ctx context.Context, t Target, st *cluster.State) (measurement, error) {
	var m measurement
	topo, ns, err := oneNode(ctx)
	if err != nil {
		return m, err
	}
	defer topo.Close()
	b, err := t.NewBackend(ns)
	if err != nil {
		return m, err
	}
	if c, ok := b.(io.Closer); ok {
		defer c.Close() // IPVS: its sockets and graceful-deletion loop
	}
	res, err := b.Sync(st, nil, true)
	if err != nil {
		return m, err
	}
	m.full, m.bytes, m.objects = res.Duration.Seconds(), res.Bytes, res.Lines
	var text string
	if t.Text != nil {
		if text, err = t.Text(b, st); err != nil {
			return m, err
		}
	}
	// One endpoint of the first Service becomes not ready.
	first := st.SortedServicePorts()[0]
	ep := st.Endpoints[first][0]
	ep.Ready, ep.Serving = false, false
	res, err = b.Sync(st, []cluster.ServicePortName{first}, t.ResyncFull)
	ep.Ready, ep.Serving = true, true
	if err != nil {
		return m, err
	}
	m.partial = res.Duration.Seconds()
	if t.ResyncFull {
		// The endpoint comes back through the incremental path.
		if res, err = b.Sync(st, []cluster.ServicePortName{first}, false); err != nil {
			return m, err
		}
		m.incremental = res.Duration.Seconds()
	}
	if t.Raw == nil {
		return m, nil
	}

	// The raw floor: the same text into a fresh namespace.
	topo2, ns2, err := oneNode(ctx)
	if err != nil {
		return m, err
	}
	defer topo2.Close()
	if t.PrepareRaw != nil {
		if err := t.PrepareRaw(ns2); err != nil {
			return m, fmt.Errorf("raw load: could not prepare its namespace: %w", err)
		}
	}
	cmd := t.Raw(ctx)
	cmd.Stdin = strings.NewReader(text)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := ns2.Run(cmd); err != nil {
		return m, fmt.Errorf("raw load (%s): %w: %s", cmd.Path, err, stderr.String())
	}
	m.raw = time.Since(start).Seconds()
	return m, nil
}
