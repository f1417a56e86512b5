package calibrate

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/sim/cluster"
)

// Synthetic builds n ClusterIP Services of k ready endpoints each, all on
// one node "node-1" (the calibration namespace), as cluster.State.
func Synthetic(n, k int) *cluster.State {
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
