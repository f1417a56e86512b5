package differential

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kpsim/kpsim/sim/apiserver"
)

// BallastNamespace holds the ballast Service of Config.Ballast.
const BallastNamespace = "kpsim-ballast"

// LargeClusterThreshold is kube-proxy's largeClusterEndpointsThreshold
// (pkg/proxy/iptables/proxier.go): with more endpoints than this in total,
// iptables mode leaves the comments out of the chains it writes and deletes
// stale chains at most once per --iptables-sync-period.
const LargeClusterThreshold = 1000

// ballastPerSlice is the endpoints of one ballast slice (the API allows
// 1,000).
const ballastPerSlice = 500

// Ballast is a ClusterIP Service (TCP 80) with n ready endpoints on a node
// that is not compared, in slices of ballastPerSlice: its ClusterIP is the
// last host of serviceCIDR and its endpoints count down from the last host
// of clusterCIDR, away from every generated scenario's addresses.
func Ballast(n int, serviceCIDR, clusterCIDR netip.Prefix) (*corev1.Service, []*discoveryv1.EndpointSlice) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: BallastNamespace, Name: "ballast"},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: lastHost(serviceCIDR).String(),
			Ports:     []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	var out []*discoveryv1.EndpointSlice
	next := lastHost(clusterCIDR)
	for k := 0; k*ballastPerSlice < n; k++ {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: BallastNamespace, Name: fmt.Sprintf("ballast-%d", k), Labels: map[string]string{
				discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "kpsim-differential"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(""), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(8080))}},
		}
		for range min(ballastPerSlice, n-k*ballastPerSlice) {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{next.String()},
				NodeName:   ptr.To("kpsim-ballast-node"),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			})
			next = next.Prev()
		}
		out = append(out, s)
	}
	return svc, out
}

// writeBallast writes cfg.Ballast's Service and slices.
func writeBallast(ctx context.Context, c kubernetes.Interface, cfg Config) error {
	svc, sls := Ballast(cfg.Ballast, cfg.ServiceCIDR, cfg.ClusterCIDR)
	if _, err := apiserver.Upsert(ctx, c, []*corev1.Service{svc}, sls); err != nil {
		return fmt.Errorf("could not write the ballast Service: %w", err)
	}
	return nil
}
