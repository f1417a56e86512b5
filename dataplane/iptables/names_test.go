package iptables

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestChainNameVectors checks kube-proxy's chain-name hashes against the test
// vectors of reference §1.2 (from kube-proxy's own tests).
func TestChainNameVectors(t *testing.T) {
	for _, c := range []struct {
		ns, svc, port string
		want          string
	}{
		{"ns1", "svc1", "p80", "XPGD46QRK7WJZT7O"},
		{"ns2", "svc2", "p80", "GNZBNJ2PO5MGZ6GT"},
		{"ns3", "svc3", "p80", "X27LE4BHSL4DOUIK"},
		{"ns4", "svc4", "p80", "4SW47YFZTEDKD3PK"},
		{"ns5", "svc5", "p80", "NUKIZ6OKUXPJNT4C"},
		{"ns1", "svc1", "", "AQI2S6QIMU7PVVRP"},
	} {
		n := name(c.ns, c.svc, c.port)
		if got := PortProtoHash(n); got != c.want {
			t.Errorf("PortProtoHash(%s) = %s, want %s", n, got, c.want)
		}
		for _, pair := range [][2]string{{ServiceChain(n), PrefixSVC}, {LocalChain(n), PrefixSVL}, {ExternalChain(n), PrefixEXT}} {
			if pair[0] != pair[1]+c.want {
				t.Errorf("chain %s does not end in %s", pair[0], c.want)
			}
			if len(pair[0]) > maxChainName {
				t.Errorf("chain %s is longer than %d", pair[0], maxChainName)
			}
		}
	}
	for _, c := range []struct {
		ns, svc, port, ep string
		want              string
	}{
		{"ns1", "svc1", "p80", "10.180.0.1:80", "KUBE-SEP-SXIVWICOYRO3J4NJ"},
		{"ns4", "svc4", "p80", "10.180.0.4:80", "KUBE-SEP-UKSFD7AGPMPPLUHC"},
		{"ns4", "svc4", "p80", "10.180.0.5:80", "KUBE-SEP-C6EBXVWJJZMIWKLZ"},
		{"ns5", "svc5", "p80", "10.180.0.3:80", "KUBE-SEP-I77PXRDZVX7PMWMN"},
	} {
		if got := EndpointChain(name(c.ns, c.svc, c.port), c.ep); got != c.want {
			t.Errorf("EndpointChain(%s/%s:%s, %s) = %s, want %s", c.ns, c.svc, c.port, c.ep, got, c.want)
		}
	}
	udp := name("ns1", "svc1", "p80")
	udp.Protocol = corev1.ProtocolUDP
	if ServiceChain(udp) == ServiceChain(name("ns1", "svc1", "p80")) {
		t.Error("the protocol is not part of the hash")
	}
	if a := AffinitySet(udp, "10.0.0.1:80", 10800); len(a) > 31 {
		t.Errorf("set name %s is longer than ipset's 31", a)
	}
	for _, c := range []string{"KUBE-SVC-X", "KUBE-SVL-X", "KUBE-EXT-X", "KUBE-FW-X", "KUBE-SEP-X"} {
		if !IsServiceChain(c) {
			t.Errorf("IsServiceChain(%s) = false", c)
		}
	}
	for _, c := range []string{ChainServices, ChainMarkMasq, "KUBE-AFF-X", "FORWARD"} {
		if IsServiceChain(c) {
			t.Errorf("IsServiceChain(%s) = true", c)
		}
	}
}

// TestProbabilityStrings checks kube-proxy's %0.10f strings and the
// kernel's quantisation as iptables-save prints it (%.11f), against the
// values of reference §1.3 and kubernetes/kubernetes#34321.
func TestProbabilityStrings(t *testing.T) {
	for n, want := range map[int]string{
		2: "0.5000000000", 3: "0.3333333333", 4: "0.2500000000", 5: "0.2000000000",
		6: "0.1666666667", 7: "0.1428571429", 10: "0.1000000000", 1000: "0.0010000000",
	} {
		if got := Probability(n); got != want {
			t.Errorf("Probability(%d) = %s, want %s", n, got, want)
		}
	}
	for n, want := range map[int]string{3: "0.33333333349", 5: "0.20000000019", 6: "0.16666666651", 7: "0.14285714272", 10: "0.10000000009"} {
		q, err := QuantizedProbability(Probability(n))
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%.11f", q); got != want {
			t.Errorf("quantised 1/%d = %s, want %s", n, got, want)
		}
	}
	r := mustRenderer(t, testConfig())
	for i := 0; i < 2; i++ { // the second round reads the cache
		for n := 1; n <= 1002; n++ {
			if got, want := r.probability(n), Probability(n); got != want {
				t.Fatalf("cached probability(%d) = %s, want %s", n, got, want)
			}
		}
	}
	if _, err := QuantizedProbability("1.5"); err == nil {
		t.Error("probability 1.5 accepted")
	}
}
