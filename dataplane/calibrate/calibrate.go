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
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/cluster"
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
}

// Calibration is sync time against size for one variant.
type Calibration struct {
	Mode    cluster.Mode `json:"mode"`
	Variant string       `json:"variant"`
	Kernel  string       `json:"kernel,omitempty"`
	Source  string       `json:"source"`
	Points  []Point      `json:"points"`
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
	// Raw returns the command that loads text raw (it reads stdin).
	Raw func(ctx context.Context) *exec.Cmd
	// PrepareRaw, when set, readies the raw load's fresh namespace with
	// what the backend creates before its first sync outside the text
	// (iptables: kube-proxy's nfacct counters, which the text matches).
	PrepareRaw func(ns *netns.Namespace) error
	// Synthetic builds n Services of k ready endpoints on node "node-1".
	Synthetic func(n, k int) *cluster.State
}

// Run measures, for each size, in fresh namespaces: a full sync, a
// partial sync after one endpoint changes, and the raw load of the full
// sync's exact text; medians of runs.
func Run(ctx context.Context, t Target, sizes []int, endpoints, runs int, log func(string, ...any)) (*Calibration, error) {
	out := &Calibration{Mode: t.Mode, Variant: t.Variant, Source: "sim calibrate --mode " + string(t.Mode)}
	for _, n := range sizes {
		st := t.Synthetic(n, endpoints)
		var full, partial, raw []float64
		var bytesN, objects int
		for r := 0; r < runs; r++ {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			m, err := measureOnce(ctx, t, st)
			if err != nil {
				return nil, err
			}
			full, partial, raw = append(full, m.full), append(partial, m.partial), append(raw, m.raw)
			bytesN, objects = m.bytes, m.objects
			runtime.GC()
		}
		pt := Point{Services: n, EndpointsPerService: endpoints, Objects: objects, FullSeconds: Median(full),
			PartialSeconds: Median(partial), RawRestoreSeconds: Median(raw), RestoreBytes: bytesN, Runs: runs}
		pt.Ratio = pt.FullSeconds / pt.RawRestoreSeconds
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
	full, partial, raw float64
	bytes, objects     int
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
	res, err := b.Sync(st, nil, true)
	if err != nil {
		return m, err
	}
	m.full, m.bytes, m.objects = res.Duration.Seconds(), res.Bytes, res.Lines
	text, err := t.Text(b, st)
	if err != nil {
		return m, err
	}
	// One endpoint of the first Service becomes not ready.
	first := st.SortedServicePorts()[0]
	ep := st.Endpoints[first][0]
	ep.Ready, ep.Serving = false, false
	res, err = b.Sync(st, []cluster.ServicePortName{first}, false)
	ep.Ready, ep.Serving = true, true
	if err != nil {
		return m, err
	}
	m.partial = res.Duration.Seconds()

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
