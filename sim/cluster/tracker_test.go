package cluster

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
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

// TestDrainParallel: a Drain of more than parallelDrain changed objects
// converts them on every CPU; its state and changes are those of the
// conversions done one by one, on a first Drain and on one with updates
// and deletions (run it with -race).
func TestDrainParallel(t *testing.T) {
	n := 2*parallelDrain + 7
	tr := NewTracker()
	svc := func(i int) (types.NamespacedName, *corev1.Service) {
		key := types.NamespacedName{Namespace: fmt.Sprintf("ns-%d", i%13), Name: fmt.Sprintf("svc-%d", i)}
		return key, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
			Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	}
	slice := func(i, eps int) *discoveryv1.EndpointSlice {
		key, _ := svc(i)
		s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name + "-abc",
			Labels: map[string]string{discoveryv1.LabelServiceName: key.Name}}, AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}}}
		for e := range eps {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 128+i/60000, i/250%240, e+1)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
		}
		return s
	}
	want := map[ServicePortName]int{} // endpoints per service port
	for i := range n {
		key, s := svc(i)
		tr.OnService(key, s)
		tr.OnEndpointSlice(key.Namespace, key.Name+"-abc", slice(i, 1+i%5), key.Name)
		want[ServicePortName{NamespacedName: key, Port: "http", Protocol: corev1.ProtocolTCP}] = 1 + i%5
	}
	check := func(step string, st *State) {
		t.Helper()
		if len(st.Services) != len(want) || len(st.Endpoints) != len(want) {
			t.Fatalf("%s: %d service ports and %d with endpoints, want %d", step, len(st.Services), len(st.Endpoints), len(want))
		}
		for name, k := range want {
			if st.Services[name] == nil || len(st.Endpoints[name]) != k {
				t.Fatalf("%s: %s has %d endpoints (service %v), want %d", step, name, len(st.Endpoints[name]), st.Services[name] != nil, k)
			}
		}
	}
	st, ch := tr.Drain()
	check("first drain", st)
	if len(ch.Services) != n || len(ch.Endpoints) != n || !slices.IsSortedFunc(ch.Services, CompareNames) {
		t.Fatalf("first drain: %d and %d changes (sorted %v), want %d each", len(ch.Services), len(ch.Endpoints), slices.IsSortedFunc(ch.Services, CompareNames), n)
	}
	// Change the endpoints of every other Service (two of each kind stay the
	// same count but not the same addresses), delete every 100th Service.
	changed := 0
	for i := 0; i < n; i += 2 {
		key, _ := svc(i)
		tr.OnEndpointSlice(key.Namespace, key.Name+"-abc", slice(i, 6), key.Name)
		want[ServicePortName{NamespacedName: key, Port: "http", Protocol: corev1.ProtocolTCP}] = 6
		changed++
	}
	deleted := 0
	for i := 1; i < n; i += 100 {
		key, _ := svc(i)
		tr.OnService(key, nil)
		tr.OnEndpointSlice(key.Namespace, key.Name+"-abc", nil, key.Name)
		delete(want, ServicePortName{NamespacedName: key, Port: "http", Protocol: corev1.ProtocolTCP})
		deleted++
	}
	if changed+deleted < parallelDrain {
		t.Fatalf("the second drain has %d changes, fewer than parallelDrain", changed+deleted)
	}
	st, ch = tr.Drain()
	check("second drain", st)
	if len(ch.Services) != deleted || len(ch.Endpoints) != changed+deleted {
		t.Fatalf("second drain: %d service and %d endpoint changes, want %d and %d", len(ch.Services), len(ch.Endpoints), deleted, changed+deleted)
	}
}
