package ipvs

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/calibrate"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/cluster"
)

// CalibrateVariant names the IPVS calibration (the simulator's IPVS
// variant, sim/simulate.IPVSVariant): the per-Service work is netlink.
const CalibrateVariant = "netlink"

// CalibrateOptions choose what to measure.
type CalibrateOptions struct {
	Sizes     []int
	Endpoints int
	Runs      int
	// IPTablesVariant applies the constant iptables rules ("": nft).
	IPTablesVariant string
	Log             func(format string, args ...any)
}

// Calibrate measures, in fresh namespaces of a kernel with IPVS, a full
// sync of N ClusterIP Services x E endpoints (virtual servers, real
// servers, kube-ipvs0 addresses, ipsets, the constant iptables rules) and
// a full resync after one endpoint changes: kube-proxy's IPVS proxier has
// no partial sync, every sync rebuilds the ipsets and queries every
// virtual server, so that resync is the second figure
// (Point.PartialSeconds). This repository's incremental sync of the same
// change is Point.IncrementalSeconds. There is no raw floor: the work is
// many netlink calls, not one text.
func Calibrate(ctx context.Context, o CalibrateOptions) (*calibrate.Calibration, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if o.IPTablesVariant == "" {
		o.IPTablesVariant = VariantNFT
	}
	if err := iptables.CheckTools(o.IPTablesVariant, true); err != nil {
		return nil, err
	}
	cfg := calibrationConfig(o.IPTablesVariant)
	cal, err := calibrate.Run(ctx, calibrate.Target{
		Mode: cluster.ModeIPVS, Variant: CalibrateVariant, Synthetic: calibrate.Synthetic, ResyncFull: true,
		NewBackend: func(ns *netns.Namespace) (dataplane.Backend, error) { return NewBackend(ns, cfg) },
	}, o.Sizes, o.Endpoints, o.Runs, o.Log)
	if err != nil {
		return nil, fmt.Errorf("ipvs calibration: %w", err)
	}
	return cal, nil
}

// calibrationConfig is the node the synthetic Services are programmed on
// (calibrate.Synthetic's node-1 and pod range); no graceful-deletion loop.
func calibrationConfig(variant string) Config {
	return Config{NodeConfig: dataplane.NodeConfig{NodeName: "node-1", ClusterCIDR: netip.MustParsePrefix("10.128.0.0/9")},
		IPTablesVariant: variant, GracefulCheckPeriod: -1}
}
