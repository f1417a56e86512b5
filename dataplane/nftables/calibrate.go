package nftables

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/cluster"
)

// CalibrateOptions choose what to measure.
type CalibrateOptions struct {
	Layout    Layout
	Sizes     []int
	Endpoints int
	Runs      int
	Log       func(format string, args ...any)
}

// Calibrate measures, for each size, in fresh namespaces: a full sync
// (render and one nft transaction), a partial sync after one endpoint
// changes, and `nft -f` of the full sync's exact text; medians of opts.Runs.
func Calibrate(ctx context.Context, o CalibrateOptions) (*dataplane.Calibration, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, fmt.Errorf("the nft command is missing (Debian package nftables)")
	}
	out := &dataplane.Calibration{Mode: "nftables", Variant: string(o.Layout), Source: "sim calibrate --mode nftables"}
	for _, n := range o.Sizes {
		st := iptables.SyntheticState(n, o.Endpoints)
		var full, partial, raw []float64
		var bytesN, ops int
		for r := 0; r < o.Runs; r++ {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			f, p, rw, b, l, err := calibrateOnce(ctx, st, o.Layout)
			if err != nil {
				return nil, err
			}
			full, partial, raw = append(full, f), append(partial, p), append(raw, rw)
			bytesN, ops = b, l
			runtime.GC()
		}
		pt := dataplane.CalibrationPoint{Services: n, EndpointsPerService: o.Endpoints, Objects: ops, FullSeconds: dataplane.Median(full),
			PartialSeconds: dataplane.Median(partial), RawRestoreSeconds: dataplane.Median(raw), RestoreBytes: bytesN, Runs: o.Runs}
		pt.Ratio = pt.FullSeconds / pt.RawRestoreSeconds
		pt.PartialOverFull = pt.PartialSeconds / pt.FullSeconds
		if o.Log != nil {
			o.Log("nftables-%s %5d services x %d: full %.3fs (raw nft -f %.3fs, ratio %.3f), partial %.4fs (%.2f%% of full), %d operations\n",
				o.Layout, n, o.Endpoints, pt.FullSeconds, pt.RawRestoreSeconds, pt.Ratio, pt.PartialSeconds, 100*pt.PartialOverFull, ops)
		}
		out.Points = append(out.Points, pt)
	}
	return out, nil
}

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

func calibrateOnce(ctx context.Context, st *cluster.State, layout Layout) (full, partial, raw float64, textBytes, ops int, err error) {
	cfg := Config{NodeName: "node-1", Layout: layout, ClusterCIDR: netip.MustParsePrefix("10.128.0.0/9")}
	// The exact text of the full sync, rendered apart (rendering twice is
	// deterministic), for the raw load.
	r, err := NewRenderer(cfg)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	tx, _, err := r.Render(st, nil, true)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	text := tx.String()

	t, ns, err := oneNode(ctx)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	defer t.Close()
	b, err := NewNamespaceBackend(ns, cfg)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	res, err := b.Sync(st, nil, true)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	full, textBytes, ops = res.Duration.Seconds(), res.Bytes, res.Lines
	var first cluster.ServicePortName
	for _, n := range st.SortedServicePorts() {
		first = n
		break
	}
	ep := st.Endpoints[first][0]
	ep.Ready, ep.Serving = false, false
	res, err = b.Sync(st, []cluster.ServicePortName{first}, false)
	ep.Ready, ep.Serving = true, true
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	partial = res.Duration.Seconds()

	t2, ns2, err := oneNode(ctx)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	defer t2.Close()
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(text)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := ns2.Run(cmd); err != nil {
		return 0, 0, 0, 0, 0, fmt.Errorf("raw nft -f: %w: %s", err, stderr.String())
	}
	raw = time.Since(start).Seconds()
	return full, partial, raw, textBytes, ops, nil
}
