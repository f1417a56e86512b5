package nftables

import (
	"context"
	"fmt"
	"os/exec"
	"time"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/cluster"
)

// CalibrateOptions choose what to measure.
type CalibrateOptions struct {
	Layout    Layout
	Sizes     []int
	Endpoints int
	Runs      int
	// Timeout bounds each nft transaction (TimeoutFlag; 0: CallBound).
	Timeout time.Duration
	// Shape is the Services' shape (calibrate.Shapes; "" is ClusterIP).
	Shape string
	Log   func(format string, args ...any)
}

// Calibrate measures full and partial syncs of a layout against `nft -f`
// of the full sync's exact text.
func Calibrate(ctx context.Context, o CalibrateOptions) (*calibrate.Calibration, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, fmt.Errorf("the nft command is missing (Debian package nftables)")
	}
	synthetic, node, err := calibrate.ShapeTarget(o.Shape)
	if err != nil {
		return nil, err
	}
	cfg := Config{NodeConfig: node, Layout: o.Layout}
	return calibrate.Run(ctx, calibrate.Target{
		Mode: cluster.ModeNFTables, Variant: string(o.Layout), Synthetic: synthetic, Source: calibrate.ShapeSource(cluster.ModeNFTables, o.Shape),
		NewBackend: func(ns *netns.Namespace) (dataplane.Backend, error) { return NewNamespaceBackend(ns, cfg, o.Timeout) },
		// The exact text the full sync loads (its elements merged as
		// nsNFT.Run merges them), rendered apart (rendering is
		// deterministic).
		Text: func(_ dataplane.Backend, st *cluster.State) (string, error) {
			r, err := NewRenderer(cfg)
			if err != nil {
				return "", err
			}
			tx, _, err := r.Render(st, nil, true)
			if err != nil {
				return "", err
			}
			return string(MergeElements([]byte(tx.String()))), nil
		},
		Raw: func(ctx context.Context) *exec.Cmd { return exec.CommandContext(ctx, "nft", "-f", "-") },
	}, o.Sizes, o.Endpoints, o.Runs, o.Log)
}
