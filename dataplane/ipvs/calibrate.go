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
// sync of N ClusterIP Services x E endpoints, all on another node
// (calibrationConfig), (virtual servers, real servers, kube-ipvs0
// addresses, ipsets, the constant iptables rules) and
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

// calibrationConfig is the node the synthetic Services are programmed on:
// calibrate.Synthetic's pod range, no graceful-deletion loop, and a node
// other than node-1, which hosts every synthetic endpoint. A real node hosts
// few of a Service's endpoints, and each local one is a KUBE-LOOP-BACK
// entry; that ipset holds at most 65,536 (kube-proxy's maxelem), which a
// node hosting all of 10,000 Services x 10 endpoints overflows ("Hash is
// full"), in kube-proxy as here.
func calibrationConfig(variant string) Config {
	return Config{NodeConfig: dataplane.NodeConfig{NodeName: calibrationNode, ClusterCIDR: netip.MustParsePrefix("10.128.0.0/9")},
		IPTablesVariant: variant, GracefulCheckPeriod: -1}
}

// calibrationNode is the calibrated node: not node-1, the synthetic
// endpoints' node.
const calibrationNode = "node-0"
