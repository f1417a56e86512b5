package differential

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Features counts what a scenario's writes exercise, by feature name: each
// Service and slice written in any step counts once per feature it has,
// and each step action once. The generator's test asserts that every
// feature occurs; the differential test prints the totals.
func Features(sc *Scenario) map[string]int {
	f := map[string]int{}
	for _, st := range sc.Steps {
		for _, s := range st.Services {
			serviceFeatures(f, s)
		}
		for _, s := range st.Slices {
			sliceFeatures(f, s, sc.Node)
		}
		for _, w := range st.What {
			f["step:"+strings.Fields(w)[0]]++
		}
		if len(st.DeleteSlices) > 0 {
			f["slice deleted"]++
		}
	}
	f["steps"] += len(sc.Steps)
	return f
}

func serviceFeatures(f map[string]int, s *corev1.Service) {
	f["type:"+string(s.Spec.Type)]++
	if len(s.Spec.Ports) > 1 {
		f["multi-port"]++
	}
	for _, p := range s.Spec.Ports {
		f["protocol:"+string(p.Protocol)]++
		if p.TargetPort.Type == intstr.String {
			f["named target port"]++
		} else {
			f["numeric target port"]++
		}
	}
	if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		f["affinity ClientIP"]++
		if c := s.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			f["affinity timeout"]++
		}
	}
	if p := s.Spec.InternalTrafficPolicy; p != nil && *p == corev1.ServiceInternalTrafficPolicyLocal {
		f["internalTrafficPolicy Local"]++
	}
	if s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		f["externalTrafficPolicy Local"]++
	}
	if s.Spec.HealthCheckNodePort != 0 {
		f["healthCheckNodePort"]++
	}
	if d := s.Spec.TrafficDistribution; d != nil {
		f["trafficDistribution:"+*d]++
	}
	if len(s.Spec.ExternalIPs) > 0 {
		f["externalIPs"]++
		if s.Spec.Type == corev1.ServiceTypeClusterIP {
			f["externalIPs on ClusterIP"]++
		}
	}
	for _, in := range s.Status.LoadBalancer.Ingress {
		switch {
		case in.IP == "":
			f["ingress hostname"]++
		case in.IPMode != nil && *in.IPMode == corev1.LoadBalancerIPModeProxy:
			f["ingress ipMode Proxy"]++
		default:
			f["ingress ipMode VIP"]++
		}
	}
	for _, r := range s.Spec.LoadBalancerSourceRanges {
		switch strings.TrimSpace(r) {
		case "0.0.0.0/0":
			f["source range 0.0.0.0/0"]++
		case "198.18.0.0/15":
			f["source range holding the node"]++
		default:
			f["source range"]++
		}
	}
}

func sliceFeatures(f map[string]int, s *discoveryv1.EndpointSlice, node string) {
	if len(s.Endpoints) == 0 {
		f["empty slice"]++
	}
	if s.Name[len(s.Name)-1] != '0' {
		f["several slices"]++
	}
	if len(s.Endpoints) >= 100 {
		f["slice of 100+ endpoints"]++
	}
	for _, e := range s.Endpoints {
		c := e.Conditions
		switch {
		case c.Ready == nil:
			f["conditions nil"]++
		case *c.Ready:
			f["ready"]++
		case c.Terminating != nil && *c.Terminating && c.Serving != nil && *c.Serving:
			f["terminating serving"]++
		case c.Terminating != nil && *c.Terminating:
			f["terminating not serving"]++
		default:
			f["not ready"]++
		}
		if e.NodeName != nil && *e.NodeName == node {
			f["endpoint on the node"]++
		} else {
			f["endpoint elsewhere"]++
		}
		if h := e.Hints; h != nil {
			if len(h.ForNodes) > 0 {
				f["node hints"]++
			} else if len(h.ForZones) > 0 {
				f["zone hints"]++
			}
		} else {
			f["no hints"]++
		}
	}
}
