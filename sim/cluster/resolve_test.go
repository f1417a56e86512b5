package cluster

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestResolvePort(t *testing.T) {
	spn := func(ns, name, port string) ServicePortName {
		return ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: corev1.ProtocolTCP}
	}
	ports := []ServicePortName{
		spn("ns-1", "svc-1", "p80"), // a generated single port the seed named
		spn("ns-2", "svc-2", ""),    // one the seed left unnamed
		spn("demo", "web", "http"),
		spn("demo", "web", "metrics"),
	}
	for _, tc := range []struct {
		service, port string
		want          ServicePortName
		err           string
	}{
		{"ns-1/svc-1", "", ports[0], ""},
		{"ns-1/svc-1", "p80", ports[0], ""},
		{"ns-2/svc-2", "", ports[1], ""},
		{"demo/web", "metrics", ports[3], ""},
		{"demo/web", "", ServicePortName{}, "service demo/web has ports http, metrics: name one with the port field"},
		{"demo/web", "grpc", ServicePortName{}, `service demo/web has no port named "grpc" (it has http, metrics)`},
		{"ns-2/svc-2", "p80", ServicePortName{}, `service ns-2/svc-2 has no port named "p80" (it has "")`},
		{"ns-3/svc-3", "", ServicePortName{}, "service ns-3/svc-3 has no service port in the cluster (headless, or not defined)"},
	} {
		got, err := ResolvePort(tc.service, tc.port, slices.Values(ports))
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if got != tc.want || msg != tc.err {
			t.Errorf("ResolvePort(%q, %q) = %v, %q; want %v, %q", tc.service, tc.port, got, msg, tc.want, tc.err)
		}
	}
}
