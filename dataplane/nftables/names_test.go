package nftables

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"
)

// Test vectors from kube-proxy's nftables helpers_test.go.
func TestNameHashes(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{ServicePortBase(name("ns1", "svc1", "p80")), "ULMVA6XW-ns1/svc1/tcp/p80"},
		{ServicePortBase(name("ns2", "svc2", "p80")), "42NFTM6N-ns2/svc2/tcp/p80"},
		{EndpointBase(name("ns1", "svc1", "p80"), "10.180.0.1:80"), "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"},
		{EndpointBase(name("ns2", "svc2", "p80"), "10.180.0.2:80"), "SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80"},
		{ServiceChain(name("ns1", "svc1", "p80")), "service-ULMVA6XW-ns1/svc1/tcp/p80"},
		{LocalChain(name("ns1", "svc1", "p80")), "local-ULMVA6XW-ns1/svc1/tcp/p80"},
		{ExternalChain(name("ns1", "svc1", "p80")), "external-ULMVA6XW-ns1/svc1/tcp/p80"},
		{EndpointChain(name("ns1", "svc1", "p80"), "10.180.0.1:80"), "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"},
		{AffinitySet(name("ns1", "svc1", "p80"), "10.180.0.1:80"), "affinity-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"},
		{EndpointMap("cluster-ip", "tcp"), "cluster-ip-endpoints-tcp"},
		{EndpointMap("node-port-local", "udp"), "node-port-endpoints-udp"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	udp := name("ns1", "svc1", "p80")
	udp.Protocol = corev1.ProtocolUDP
	if got := ServicePortBase(udp); !strings.HasSuffix(got, "-ns1/svc1/udp/p80") || got == "ULMVA6XW-ns1/svc1/tcp/p80" {
		t.Errorf("udp base %q", got)
	}
}

// TestNameTruncation: names longer than knftables allows are cut, keeping
// the hash of the full name.
func TestNameTruncation(t *testing.T) {
	cut := HashAndTruncate(strings.Repeat("x", 300))
	if len(cut) != knftables.NameLengthMax-16 || !strings.HasSuffix(cut, "...") {
		t.Errorf("cut name of %d characters: %q", len(cut), cut)
	}
	// The longest valid names (63-character namespace and Service, 15-
	// character port) are never cut, as kube-proxy's comment says.
	long := strings.Repeat("a", 63)
	spn := name(long, long, strings.Repeat("p", 15))
	got := EndpointChain(spn, "10.180.0.1:80")
	if strings.HasSuffix(got, "...") || len(got) > knftables.NameLengthMax {
		t.Errorf("name of %d characters: %q", len(got), got)
	}
	v6 := EndpointBase(name("ns", "svc", "p"), "[2001:db8::1]:80")
	if strings.Contains(v6, ":") || !strings.HasSuffix(v6, "__2001.db8..1/80") {
		t.Errorf("IPv6 endpoint base %q", v6)
	}
	if !IsServiceChain(got) || IsServiceChain(ChainServices) {
		t.Error("IsServiceChain")
	}
}
