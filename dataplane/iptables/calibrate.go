package iptables

import (
	"context"
	"os/exec"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/cluster"
)

// CalibrateOptions choose what to measure.
type CalibrateOptions struct {
	Variant   string
	Sizes     []int
	Endpoints int
	Runs      int
	// Shape is the Services' shape (calibrate.Shapes; "" is ClusterIP).
	Shape string
	Log   func(format string, args ...any)
}

// Calibrate measures full and partial syncs of kube-proxy's iptables rules
// against a raw `iptables-restore --noflush --counters` of the same text.
func Calibrate(ctx context.Context, o CalibrateOptions) (*calibrate.Calibration, error) {
	if err := CheckTools(o.Variant, false); err != nil {
		return nil, err
	}
	synthetic, node, err := calibrate.ShapeTarget(o.Shape)
	if err != nil {
		return nil, err
	}
	return calibrate.Run(ctx, calibrate.Target{
		Mode: cluster.ModeIPTables, Variant: o.Variant, Synthetic: synthetic, Source: calibrate.ShapeSource(cluster.ModeIPTables, o.Shape),
		NewBackend: func(ns *netns.Namespace) (dataplane.Backend, error) {
			return NewBackend(ns, Config{NodeConfig: node}, o.Variant)
		},
		Text: func(b dataplane.Backend, _ *cluster.State) (string, error) { return b.(*Backend).LastText, nil },
		Raw: func(ctx context.Context) *exec.Cmd {
			return exec.CommandContext(ctx, Tool(o.Variant, "restore"), "--noflush", "--counters")
		},
		// The text's INVALID drop rule matches an nfacct counter, which
		// the backend creates before its full sync; a fresh namespace
		// has none and the restore would fail on that rule.
		PrepareRaw: func(ns *netns.Namespace) error {
			// As the backend does (ensureNFAcct): a counter this kernel
			// cannot create (no nfnetlink_acct, as in the microVM's) is
			// one the backend's text does not match either.
			for _, name := range NFAcctCounters {
				_ = NFAcctEnsure(ns, name)
			}
			return nil
		},
	}, o.Sizes, o.Endpoints, o.Runs, o.Log)
}
