package apiserver

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kpsim/kpsim/sim/scenario"
)

// Snapshot is a Service's endpoints as its EndpointSlices held them, by
// slice name: what a check that changes them writes back (ActRestore).
type Snapshot map[string][]discoveryv1.Endpoint

// Snapshot reads the endpoints of Service ns/name's slices from the API.
func (c *Cluster) Snapshot(ctx context.Context, service string) (Snapshot, error) {
	ns, name, _ := strings.Cut(service, "/")
	sl, err := slicesFromAPI(ctx, c.Client, ns, name)
	if err != nil {
		return nil, err
	}
	out := Snapshot{}
	for _, x := range sl {
		eps := make([]discoveryv1.Endpoint, len(x.Endpoints))
		for i := range x.Endpoints {
			x.Endpoints[i].DeepCopyInto(&eps[i])
		}
		out[x.Name] = eps
	}
	return out, nil
}

// restore writes each slice's endpoints back as snap holds them, one write
// per slice that differs. A slice the snapshot does not know is refused:
// restore only undoes changes to endpoints (never a slice's creation).
func restore(ctx context.Context, client kubernetes.Interface, sl []*discoveryv1.EndpointSlice, snap Snapshot) (int, error) {
	if len(snap) == 0 {
		return 0, fmt.Errorf("no snapshot to restore")
	}
	for _, x := range sl {
		if _, ok := snap[x.Name]; !ok {
			return 0, fmt.Errorf("EndpointSlice %s/%s was created after the snapshot: restore cannot undo it", x.Namespace, x.Name)
		}
	}
	n := 0
	for _, x := range sl {
		want := snap[x.Name]
		if equality.Semantic.DeepEqual(x.Endpoints, want) {
			continue
		}
		err := updateSlice(ctx, client, x, func(y *discoveryv1.EndpointSlice) {
			y.Endpoints = make([]discoveryv1.Endpoint, len(want))
			for i := range want {
				want[i].DeepCopyInto(&y.Endpoints[i])
			}
		})
		if err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// add puts a ready endpoint at s.Endpoint on node s.Node into the
// Service's last slice (refused when it is full, or when the address is
// one of the Service's endpoints already); later scale steps do not hand
// the address out.
func (c *Cluster) add(ctx context.Context, sl []*discoveryv1.EndpointSlice, s Step) (int, error) {
	a, err := netip.ParseAddr(s.Endpoint)
	if err != nil {
		return 0, fmt.Errorf("endpoint %q is not an address", s.Endpoint)
	}
	node, err := c.Client.CoreV1().Nodes().Get(ctx, s.Node, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("could not read Node %s: %w", s.Node, err)
	}
	for _, x := range sl {
		for _, ep := range x.Endpoints {
			if len(ep.Addresses) > 0 && ep.Addresses[0] == a.String() {
				return 0, fmt.Errorf("%s is an endpoint of %s already", a, s.Service)
			}
		}
	}
	c.mu.Lock()
	c.allocated[a] = true
	c.mu.Unlock()
	last := sl[len(sl)-1]
	if len(last.Endpoints) >= scenario.MaxEndpointsPerSlice {
		return 0, fmt.Errorf("EndpointSlice %s/%s is full", last.Namespace, last.Name)
	}
	ep := readyEndpoint(a, node)
	if err := updateSlice(ctx, c.Client, last, func(x *discoveryv1.EndpointSlice) { x.Endpoints = append(x.Endpoints, ep) }); err != nil {
		return 0, err
	}
	return 1, nil
}

// readyEndpoint is a ready, serving endpoint at a on node n, in its zone.
func readyEndpoint(a netip.Addr, n *corev1.Node) discoveryv1.Endpoint {
	t, name := true, n.Name
	ep := discoveryv1.Endpoint{Addresses: []string{a.String()}, NodeName: &name,
		Conditions: discoveryv1.EndpointConditions{Ready: &t, Serving: &t, Terminating: new(bool)}}
	if z, ok := n.Labels[scenario.LabelZone]; ok {
		ep.Zone = &z
	}
	return ep
}
