package iptables

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"

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

// Calibrate measures full and partial syncs of kube-proxy's iptables rules
// against a raw `iptables-restore --noflush --counters` of the same text.
func Calibrate(ctx context.Context, o CalibrateOptions) (*Calibration, error) {
	if err := CheckTools(o.Variant, false); err != nil {
		return nil, err
	}
	return dataplane.Calibrate(ctx, dataplane.CalibrationTarget{
		Mode: cluster.ModeIPTables, Variant: o.Variant, Synthetic: SyntheticState,
		NewBackend: func(ns *netns.Namespace) (dataplane.Backend, error) {
			return NewBackend(ns, Config{NodeConfig: dataplane.NodeConfig{NodeName: "node-1", ClusterCIDR: netip.MustParsePrefix("10.128.0.0/9")}}, o.Variant)
		},
		Text: func(b dataplane.Backend, _ *cluster.State) (string, error) { return b.(*Backend).LastText, nil },
		Raw: func(ctx context.Context) *exec.Cmd {
			return exec.CommandContext(ctx, Tool(o.Variant, "restore"), "--noflush", "--counters")
		},
	}, o.Sizes, o.Endpoints, o.Runs, o.Log)
}
