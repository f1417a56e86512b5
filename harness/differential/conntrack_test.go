package differential

import (
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpsim/kpsim/dataplane/conntrack"
)

func TestPlantedFlows(t *testing.T) {
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	name := "dns"
	yes, no := true, false
	dns := corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "d-1", Name: "dns"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ExternalIPs: []string{"100.64.0.1"},
			Ports: []corev1.ServicePort{{Name: "dns", Protocol: udp, Port: 53, NodePort: 30053}, {Name: "web", Protocol: tcp, Port: 80}}}}
	port, webPort := int32(5353), int32(8080)
	web := "web"
	sl := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "d-1", Name: "dns-1", Labels: map[string]string{discoveryv1.LabelServiceName: "dns"}},
		Ports: []discoveryv1.EndpointPort{{Name: &name, Protocol: &udp, Port: &port}, {Name: &web, Protocol: &tcp, Port: &webPort}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.244.0.6"}, Conditions: discoveryv1.EndpointConditions{Ready: &no, Serving: &no}},
			{Addresses: []string{"10.244.0.7"}, Conditions: discoveryv1.EndpointConditions{Ready: &no, Serving: &yes}},
		}}
	flows := PlantedFlows([]corev1.Service{dns}, []discoveryv1.EndpointSlice{sl}, netip.MustParseAddr("172.18.0.2"))
	var got []string
	for i, f := range flows {
		if f.Forward.SrcPort != plantedPort+uint16(i) || f.Forward.Protocol == unix.IPPROTO_TCP && f.ProtoInfo == nil {
			t.Errorf("flow %d: %s", i, conntrack.Describe(f))
		}
		got = append(got, conntrack.Describe(f)[len("udp 192.0.2.77:10000 "):])
	}
	want := []string{
		// The serving endpoints (ready, and serving while terminating) from
		// every frontend of the UDP port; the not-serving one never.
		"-> 10.96.0.10:53 reply from 10.244.0.5:5353", "-> 10.96.0.10:53 reply from 10.244.0.7:5353",
		"-> 100.64.0.1:53 reply from 10.244.0.5:5353", "-> 100.64.0.1:53 reply from 10.244.0.7:5353",
		"-> 172.18.0.2:30053 reply from 10.244.0.5:5353", "-> 172.18.0.2:30053 reply from 10.244.0.7:5353",
		"-> 10.96.0.10:80 reply from 10.244.0.5:8080",
	}
	if !slices.Equal(got, want) {
		t.Errorf("planted\n%q\nwant\n%q", got, want)
	}
}
