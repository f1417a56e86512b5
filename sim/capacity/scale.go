package capacity

import (
	"fmt"
	"math"
	"math/bits"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// Node policies of the sweep (--nodes).
const (
	// NodesScaled multiplies cluster.nodeCount by size / the scenario's
	// Services: endpoints per node (pod density) and traffic per node stay
	// the scenario's.
	NodesScaled = "scaled"
	// NodesFixed keeps cluster.nodeCount: the same nodes carry more pods.
	NodesFixed = "fixed"
)

// Shape is what the sweep keeps from one size to the next: measured on the
// generated cluster state, so a test can hold the scaled states to it.
type Shape struct {
	Services     int `json:"services"`
	ServicePorts int `json:"servicePorts"`
	Nodes        int `json:"nodes"`
	Endpoints    int `json:"endpoints"`
	// MeanEndpoints is endpoints per service port (every endpoint the
	// EndpointSlices list, ready or not).
	MeanEndpoints float64 `json:"meanEndpointsPerServicePort"`
	// Fractions of service ports.
	Affinity      float64 `json:"sessionAffinityFraction"`
	InternalLocal float64 `json:"internalTrafficPolicyLocalFraction"`
	ExternalLocal float64 `json:"externalTrafficPolicyLocalFraction"`
}

// shapeOf measures a state.
func shapeOf(services int, st *cluster.State) Shape {
	sh := Shape{Services: services, ServicePorts: len(st.Services), Nodes: len(st.Nodes)}
	var aff, itp, etp int
	for name, sp := range st.Services {
		sh.Endpoints += len(st.Endpoints[name])
		if sp.ClientIPAffinity {
			aff++
		}
		if sp.InternalLocal {
			itp++
		}
		if sp.ExternalLocal {
			etp++
		}
	}
	if n := float64(sh.ServicePorts); n > 0 {
		sh.MeanEndpoints = float64(sh.Endpoints) / n
		sh.Affinity, sh.InternalLocal, sh.ExternalLocal = float64(aff)/n, float64(itp)/n, float64(etp)/n
	}
	return sh
}

// stateOf expands a loaded scenario straight into a tracker (no clientset,
// no informers: the sweep reads the state once and never writes to it) and
// returns the cluster state kube-proxy would see.
func stateOf(l *scenario.Loaded, seed *uint64) (*cluster.State, *scenario.Expanded, error) {
	t := cluster.NewTracker()
	sink := func(o runtime.Object) error {
		switch x := o.(type) {
		case *corev1.Service:
			t.OnService(types.NamespacedName{Namespace: x.Namespace, Name: x.Name}, x)
		case *discoveryv1.EndpointSlice:
			t.OnEndpointSlice(x.Namespace, x.Name, x, x.Labels[discoveryv1.LabelServiceName])
		}
		return nil
	}
	exp, err := scenario.ExpandTo(l, seed, sink)
	if err != nil {
		return nil, nil, err
	}
	for _, n := range exp.Nodes {
		t.OnNode(n.Name, n)
	}
	st, _ := t.Drain()
	return st, exp, nil
}

// scaled returns a copy of the loaded scenario with its generator at
// services and, under NodesScaled, cluster.nodeCount multiplied likewise.
// The address ranges are widened where the scaled cluster would not fit
// them (they enter no count; the message says so); base is the scenario's
// own shape, which sizes the pod blocks.
func scaled(l *scenario.Loaded, base Shape, services int, nodes string) (*scenario.Loaded, []string, error) {
	sc := *l.Scenario
	g := *sc.Generate
	g.Services = services
	sc.Generate = &g
	c := sc.Cluster
	f := float64(services) / float64(base.Services)
	var notes []string
	if nodes == NodesScaled && c.NodeCount > 0 {
		c.NodeCount = max(1, int(math.Round(float64(c.NodeCount)*f)))
	}
	nnodes := c.NodeCount + len(c.Nodes)
	// Pods per node at this size (spread placement is even; random is
	// binomial), with room to spare.
	pods := float64(base.Endpoints) * f / float64(max(1, g.Ports.PerService))
	perNode := 2*pods/float64(max(1, nnodes)) + 64
	blockBits := max(32-c.NodeCIDRMaskSize, bits.Len64(uint64(perNode)))
	svcNeed := uint64(float64(services)*1.1) + 16
	if svc := netip.MustParsePrefix(c.ServiceCIDR); capacityOf(svc) < svcNeed {
		wide, ok := pickRange(svcNeed, []string{"10.96.0.0/12", "172.16.0.0/12"}, netip.MustParsePrefix(c.NodeNetwork))
		if !ok {
			return nil, nil, fmt.Errorf("%d Services do not fit any service range the sweep knows", services)
		}
		notes = append(notes, fmt.Sprintf("serviceCIDR widened to %s for %d Services", wide, services))
		c.ServiceCIDR = wide.String()
	}
	podNeed := uint64(nnodes) << blockBits
	if pod := netip.MustParsePrefix(c.PodCIDR); capacityOf(pod) < podNeed || 32-c.NodeCIDRMaskSize < blockBits {
		svc := netip.MustParsePrefix(c.ServiceCIDR)
		wide, ok := pickRange(podNeed, []string{c.PodCIDR, "10.128.0.0/9", "100.64.0.0/10", "10.0.0.0/8"}, svc, netip.MustParsePrefix(c.NodeNetwork))
		if !ok {
			return nil, nil, fmt.Errorf("%d nodes of %d pods each do not fit any pod range the sweep knows", nnodes, int(perNode))
		}
		c.PodCIDR, c.NodeCIDRMaskSize = wide.String(), 32-blockBits
		notes = append(notes, fmt.Sprintf("podCIDR %s with /%d node blocks for %d nodes", c.PodCIDR, c.NodeCIDRMaskSize, nnodes))
	}
	sc.Cluster = c
	// Events name the scenario's own Services; the sweep uses only their
	// rate (Options.EventRate), not the events themselves.
	sc.Events, sc.Checks = nil, nil
	out := *l
	out.Scenario = &sc
	return &out, notes, nil
}

func capacityOf(p netip.Prefix) uint64 { return uint64(1) << (32 - p.Bits()) }

// pickRange is the first candidate that holds need addresses and overlaps
// none of avoid.
func pickRange(need uint64, candidates []string, avoid ...netip.Prefix) (netip.Prefix, bool) {
	for _, s := range candidates {
		p, err := netip.ParsePrefix(s)
		if err != nil || capacityOf(p) < need {
			continue
		}
		clash := false
		for _, a := range avoid {
			clash = clash || p.Overlaps(a)
		}
		if !clash {
			return p.Masked(), true
		}
	}
	return netip.Prefix{}, false
}
