package iptables

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/cluster"
)

// CalibrationPoint and Calibration are the shared calibration file shapes.
type (
	CalibrationPoint = dataplane.CalibrationPoint
	Calibration      = dataplane.Calibration
)

// SyntheticState builds n ClusterIP Services of k ready endpoints each, all
// on one node "node-1" (the calibration namespace), as cluster.State.
func SyntheticState(n, k int) *cluster.State {
	st := &cluster.State{Services: map[cluster.ServicePortName]*cluster.ServicePort{}, Endpoints: map[cluster.ServicePortName][]*cluster.Endpoint{},
		Nodes: map[string]*cluster.Node{"node-1": {Name: "node-1", IP: netip.MustParseAddr("198.18.0.1"), PodCIDR: netip.MustParsePrefix("10.128.0.0/9")}}}
	for i := 0; i < n; i++ {
		spn := cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: fmt.Sprintf("ns-%d", i%100), Name: fmt.Sprintf("svc-%d", i)}, Port: "http", Protocol: corev1.ProtocolTCP}
		st.Services[spn] = &cluster.ServicePort{Name: spn, Type: corev1.ServiceTypeClusterIP, ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, TargetPort: "8080"}
		eps := make([]*cluster.Endpoint, k)
		for j := range eps {
			x := i*k + j + 1
			eps[j] = &cluster.Endpoint{IP: netip.AddrFrom4([4]byte{10, byte(128 + x>>16), byte(x >> 8), byte(x)}), Port: 8080, Ready: true, Serving: true, NodeName: "node-1"}
		}
		st.Endpoints[spn] = eps
	}
	return st
}

// CalibrateOptions choose what to measure.
type CalibrateOptions struct {
	Variant   string
	Sizes     []int
	Endpoints int
	Runs      int
	Log       func(format string, args ...any)
}

// Calibrate measures, for each size, in fresh namespaces: a full sync (render
// and restore), a partial sync after one endpoint changes, and the raw
// restore of the full sync's exact text; medians of opts.Runs runs.
func Calibrate(ctx context.Context, o CalibrateOptions) (*Calibration, error) {
	if err := CheckTools(o.Variant, false); err != nil {
		return nil, err
	}
	out := &Calibration{Mode: "iptables", Variant: o.Variant, Source: "sim calibrate --mode iptables"}
	for _, n := range o.Sizes {
		st := SyntheticState(n, o.Endpoints)
		var full, partial, raw []float64
		var bytesN, lines int
		for r := 0; r < o.Runs; r++ {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			f, p, rw, b, l, err := calibrateOnce(ctx, st, o.Variant)
			if err != nil {
				return nil, err
			}
			full, partial, raw = append(full, f), append(partial, p), append(raw, rw)
			bytesN, lines = b, l
			runtime.GC()
		}
		pt := CalibrationPoint{Services: n, EndpointsPerService: o.Endpoints, Objects: lines, FullSeconds: median(full),
			PartialSeconds: median(partial), RawRestoreSeconds: median(raw), RestoreBytes: bytesN, Runs: o.Runs}
		pt.Ratio = pt.FullSeconds / pt.RawRestoreSeconds
		pt.PartialOverFull = pt.PartialSeconds / pt.FullSeconds
		if o.Log != nil {
			o.Log("iptables-%s %5d services x %d: full %.3fs (raw restore %.3fs, ratio %.3f), partial %.3fs (%.1f%% of full), %d lines\n",
				o.Variant, n, o.Endpoints, pt.FullSeconds, pt.RawRestoreSeconds, pt.Ratio, pt.PartialSeconds, 100*pt.PartialOverFull, lines)
		}
		out.Points = append(out.Points, pt)
	}
	return out, nil
}

func median(v []float64) float64 { return dataplane.Median(v) }

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

func calibrateOnce(ctx context.Context, st *cluster.State, variant string) (full, partial, raw float64, restoreBytes, lines int, err error) {
	t, ns, err := oneNode(ctx)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	defer t.Close()
	b, err := NewBackend(ns, Config{NodeName: "node-1", ClusterCIDR: netip.MustParsePrefix("10.128.0.0/9")}, variant)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	res, err := b.Sync(st, nil, true)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	full, restoreBytes, lines = res.Duration.Seconds(), res.Bytes, res.Lines
	text := b.LastText
	// One endpoint of the first Service becomes not ready.
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

	// The raw floor: the same text into a fresh namespace.
	t2, ns2, err := oneNode(ctx)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	defer t2.Close()
	cmd := exec.CommandContext(ctx, Tool(variant, "restore"), "--noflush", "--counters")
	cmd.Stdin = strings.NewReader(text)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := ns2.Run(cmd); err != nil {
		return 0, 0, 0, 0, 0, fmt.Errorf("raw restore: %w: %s", err, stderr.String())
	}
	raw = time.Since(start).Seconds()
	return full, partial, raw, restoreBytes, lines, nil
}
