package calibrate

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Shapes of the Services a calibration measures.
const (
	// ShapeClusterIP: ClusterIP Services only (Synthetic; the cost model's
	// calibrations).
	ShapeClusterIP = "cluster-ip"
	// ShapeExternal: every tenth Service is a LoadBalancer with a node
	// port, an external IP and a load-balancer ingress IP; every other one
	// of those has loadBalancerSourceRanges, the others
	// externalTrafficPolicy Local (with a health check node port).
	ShapeExternal = "external"
)

// Shapes lists the shapes.
var Shapes = []string{ShapeClusterIP, ShapeExternal}

// The addresses of the calibration's objects.
var (
	// ServiceCIDR holds the cluster IPs, from its 16th address up (clear of
	// default/kubernetes).
	ServiceCIDR = netip.MustParsePrefix("10.96.0.0/12")
	// PodCIDR holds the endpoints.
	PodCIDR = netip.MustParsePrefix("10.128.0.0/9")
	// NodeIP is node-1's address, the node measured.
	NodeIP = netip.MustParseAddr("198.18.0.1")
)

// Node ports of the external shape: the LoadBalancers' from 30000, the
// health check node ports from 31500, both inside the API server's default
// range (30000-32767).
const (
	firstNodePort     = 30000
	firstHealthPort   = 31500
	maxExternalShaped = 15000 // 1,500 LoadBalancers: node ports to 31499
)

// Objects are the API objects of n Services of k ready endpoints each, all
// on node-1, in namespaces ns-0 to ns-99, as kube-apiserver takes them
// (the load-balancer ingress is the Services' status). The endpoints are
// the ones Synthetic gives.
func Objects(n, k int, shape string) ([]*corev1.Service, []*discoveryv1.EndpointSlice, error) {
	switch shape {
	case ShapeClusterIP, "":
	case ShapeExternal:
		if n > maxExternalShaped {
			return nil, nil, fmt.Errorf("the %s shape holds at most %d Services (its node ports), not %d", shape, maxExternalShaped, n)
		}
	default:
		return nil, nil, fmt.Errorf("unknown shape %q (%v)", shape, Shapes)
	}
	var svcs []*corev1.Service
	var slices []*discoveryv1.EndpointSlice
	base := ServiceCIDR.Addr().As4()
	for i := 0; i < n; i++ {
		ns, name := fmt.Sprintf("ns-%d", i%100), fmt.Sprintf("svc-%d", i)
		v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3]) + 16 + uint32(i)
		ip := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ip.String(), ClusterIPs: []string{ip.String()},
				Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
		if shape == ShapeExternal && i%10 == 0 {
			external(svc, i/10)
		}
		svcs = append(svcs, svc)
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-0", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}}}
		for j := 0; j < k; j++ {
			x := i*k + j + 1
			a := netip.AddrFrom4([4]byte{10, byte(128 + x>>16), byte(x >> 8), byte(x)})
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()}, NodeName: ptr.To("node-1"),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}})
		}
		slices = append(slices, sl)
	}
	return svcs, slices, nil
}

// external makes svc the j-th LoadBalancer of the external shape.
func external(svc *corev1.Service, j int) {
	s := &svc.Spec
	s.Type = corev1.ServiceTypeLoadBalancer
	s.Ports[0].NodePort = int32(firstNodePort + j)
	s.ExternalIPs = []string{netip.AddrFrom4([4]byte{100, 64, byte(j >> 8), byte(j)}).String()}
	if j%2 == 0 {
		s.LoadBalancerSourceRanges = []string{"192.0.2.0/24"}
		s.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	} else {
		s.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.HealthCheckNodePort = int32(firstHealthPort + j/2)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: netip.AddrFrom4([4]byte{100, 96, byte(j >> 8), byte(j)}).String(), IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
}

// State is what a proxy on node-1 builds from objects (cluster.Tracker).
func State(svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice) *cluster.State {
	tr := cluster.NewTracker()
	tr.OnNode("node-1", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: corev1.NodeSpec{PodCIDR: PodCIDR.String()},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: NodeIP.String()}}}})
	for _, s := range svcs {
		tr.OnService(types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, s)
	}
	for _, sl := range slices {
		tr.OnEndpointSlice(sl.Namespace, sl.Name, sl, sl.Labels[discoveryv1.LabelServiceName])
	}
	st, _ := tr.Drain()
	return st
}

// ShapeTarget gives a calibration of shape its Synthetic function and the
// node it programs: Synthetic itself and node-1 without addresses (the
// cost model's calibrations) for ShapeClusterIP; for another shape the
// tracker's State of Objects, and node-1 with NodeIP, as kube-proxy's
// Node object gives it (its node ports listen there).
func ShapeTarget(shape string) (func(n, k int) *cluster.State, dataplane.NodeConfig, error) {
	node := dataplane.NodeConfig{NodeName: "node-1", ClusterCIDR: PodCIDR}
	switch shape {
	case ShapeClusterIP, "":
		return Synthetic, node, nil
	case ShapeExternal:
		node.NodeIPs = []netip.Addr{NodeIP}
		return func(n, k int) *cluster.State {
			svcs, slices, err := Objects(n, k, shape)
			if err != nil {
				panic(err) // CheckShape refused the size before
			}
			return State(svcs, slices)
		}, node, nil
	}
	return nil, node, fmt.Errorf("unknown shape %q (%v)", shape, Shapes)
}

// ShapeSource is the command a calibration of mode and shape records.
func ShapeSource(mode cluster.Mode, shape string) string {
	src := "sim calibrate --mode " + string(mode)
	if shape != "" && shape != ShapeClusterIP {
		src += " --shape " + shape
	}
	return src
}

// CheckShape says whether shape is known and holds every size.
func CheckShape(shape string, sizes []int) error {
	if _, _, err := Objects(0, 0, shape); err != nil {
		return err
	}
	for _, n := range sizes {
		if shape == ShapeExternal && n > maxExternalShaped {
			return fmt.Errorf("the %s shape holds at most %d Services (its node ports), not %d", shape, maxExternalShaped, n)
		}
	}
	return nil
}
