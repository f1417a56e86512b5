package apiserver

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// BenchmarkFloor30000 is the bare floor the loading path is measured against
// (design.md): 30,000 Services and 30,000 EndpointSlices of 10 endpoints
// created in the fake clientset, then Service and EndpointSlice informers
// synced. Nothing of ours runs.
func BenchmarkFloor30000(b *testing.B) {
	for i := 0; i < b.N; i++ {
		client := fake.NewSimpleClientset()
		tr := client.Tracker()
		for s := 0; s < 30000; s++ {
			ns, name := fmt.Sprintf("ns-%d", s%100), fmt.Sprintf("svc-%d", s)
			svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.%d.%d", s/250, s%250+1), Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
			if err := tr.Add(svc); err != nil {
				b.Fatal(err)
			}
			// The same fields as the generator writes, so that the floor
			// carries objects of the same size.
			port, proto, pname := int32(8080), corev1.ProtocolTCP, ""
			sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-abcde", Namespace: ns,
				Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
				AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}}}
			for e := 0; e < 10; e++ {
				ready, serving, terminating := true, true, false
				node, zone := fmt.Sprintf("node-%d", e), fmt.Sprintf("zone-%d", e%3)
				sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 128+s/4000, (s/16)%250, (s%16)*10+e+1)},
					Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}, NodeName: &node, Zone: &zone})
			}
			if err := tr.Add(sl); err != nil {
				b.Fatal(err)
			}
		}
		f := informers.NewSharedInformerFactory(client, 0)
		si := f.Core().V1().Services().Informer()
		ei := f.Discovery().V1().EndpointSlices().Informer()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		f.Start(ctx.Done())
		if !cache.WaitForCacheSync(ctx.Done(), si.HasSynced, ei.HasSynced) {
			b.Fatal("no sync")
		}
		cancel()
		f.Shutdown()
	}
}
