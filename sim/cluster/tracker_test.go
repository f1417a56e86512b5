package cluster

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestServicePortsHealthCheckNodePort: kube-proxy uses a Service's
// healthCheckNodePort only for type LoadBalancer with
// externalTrafficPolicy Local (apiservice.NeedsHealthCheck).
func TestServicePortsHealthCheckNodePort(t *testing.T) {
	for _, c := range []struct {
		typ  corev1.ServiceType
		etp  corev1.ServiceExternalTrafficPolicy
		want int32
	}{
		{corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal, 30900},
		{corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyCluster, 0},
		{corev1.ServiceTypeNodePort, corev1.ServiceExternalTrafficPolicyLocal, 0},
	} {
		s := &corev1.Service{Spec: corev1.ServiceSpec{Type: c.typ, ExternalTrafficPolicy: c.etp, ClusterIP: "10.96.0.22", HealthCheckNodePort: 30900,
			Ports: []corev1.ServicePort{{Name: "a", Port: 80, NodePort: 30081}, {Name: "b", Port: 81, NodePort: 30082}}}}
		for _, sp := range servicePorts(s) {
			if sp.HealthCheckNodePort != c.want {
				t.Errorf("%s %s port %s: HealthCheckNodePort %d, want %d", c.typ, c.etp, sp.Name.Port, sp.HealthCheckNodePort, c.want)
			}
		}
	}
}
