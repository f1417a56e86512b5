package nftables

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane/trace"
	"github.com/kpsim/kpsim/sim/cluster"
)

// overallState is one node's view of a cluster with one Service of each kind
// the layouts distinguish.
func overallState() *cluster.State {
	st := newTestState()
	// svc1: kube-proxy's test Service, one endpoint.
	add(st, clusterIPPort(name("ns1", "svc1", "p80"), "172.30.0.41", 80), ep("10.180.0.1", 80, otherNode, "R"))
	// svc2: three ready endpoints (one local) and one not ready.
	add(st, clusterIPPort(name("ns2", "svc2", "p80"), "172.30.0.42", 80),
		ep("10.180.0.4", 80, otherNode, "R"), ep("10.180.0.5", 80, thisNode, "R"), ep("10.180.0.6", 80, thisNode, ""), ep("10.180.1.7", 80, otherNode, "R"))
	// svc3: ClientIP affinity.
	sp3 := clusterIPPort(name("ns3", "svc3", "p80"), "172.30.0.43", 80)
	sp3.ClientIPAffinity, sp3.AffinityTimeout = true, 10800
	add(st, sp3, ep("10.180.0.3", 80, otherNode, "R"), ep("10.180.2.3", 80, thisNode, "R"))
	// svc4: internalTrafficPolicy Local with a local endpoint.
	sp4 := clusterIPPort(name("ns4", "svc4", "p80"), "172.30.0.44", 80)
	sp4.InternalLocal = true
	add(st, sp4, ep("10.180.0.8", 80, thisNode, "R"), ep("10.180.0.9", 80, otherNode, "R"))
	// svc5: internalTrafficPolicy Local without one: DROP.
	sp5 := clusterIPPort(name("ns5", "svc5", "p80"), "172.30.0.45", 80)
	sp5.InternalLocal = true
	add(st, sp5, ep("10.180.0.10", 80, otherNode, "R"))
	// svc6: no endpoints: REJECT.
	add(st, clusterIPPort(name("ns6", "svc6", "p80"), "172.30.0.46", 80))
	// svc7: only terminating endpoints (one serving, one not).
	add(st, clusterIPPort(name("ns7", "svc7", "p80"), "172.30.0.47", 80),
		ep("10.180.0.11", 80, otherNode, "ST"), ep("10.180.0.12", 80, otherNode, "T"))
	// svc8: NodePort, externalTrafficPolicy Local, UDP.
	n8 := name("ns8", "svc8", "dns")
	n8.Protocol = corev1.ProtocolUDP
	sp8 := clusterIPPort(n8, "172.30.0.48", 53)
	sp8.Type, sp8.NodePort, sp8.ExternalLocal = corev1.ServiceTypeNodePort, 30053, true
	add(st, sp8, ep("10.180.0.13", 53, thisNode, "R"), ep("10.180.0.14", 53, otherNode, "R"))
	// svc9: NodePort, Cluster policies, unnamed port.
	sp9 := clusterIPPort(name("ns9", "svc9", ""), "172.30.0.49", 8080)
	sp9.Type, sp9.NodePort = corev1.ServiceTypeNodePort, 30080
	add(st, sp9, ep("10.180.0.15", 8080, otherNode, "R"))
	// svc10: NodePort, externalTrafficPolicy Local without a local endpoint.
	sp10 := clusterIPPort(name("ns10", "svc10", "p80"), "172.30.0.50", 80)
	sp10.Type, sp10.NodePort, sp10.ExternalLocal = corev1.ServiceTypeNodePort, 30010, true
	add(st, sp10, ep("10.180.0.16", 80, otherNode, "R"))
	return st
}

// traceTable traces pod, external and host clients to every cluster IP and
// node port of st, one line per flow.
func traceTable(t *testing.T, f *knftables.Fake, st *cluster.State) string {
	t.Helper()
	tr := tracer(t, f)
	var b strings.Builder
	for _, n := range st.SortedServicePorts() {
		sp := st.Services[n]
		proto := strings.ToLower(string(n.Protocol))
		dsts := []netip.AddrPort{netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port))}
		if sp.NodePort != 0 {
			dsts = append(dsts, netip.AddrPortFrom(nodeIP, uint16(sp.NodePort)))
		}
		for _, d := range dsts {
			for _, src := range []netip.Addr{podIP, extIP, nodeIP} {
				res, err := tr.Trace(trace.Packet{Src: src, Protocol: proto, Dst: d.Addr(), DPort: int(d.Port())}, nil)
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(&b, "%s %s -> %s %s: %s\n", n, src, proto, d, res)
			}
		}
	}
	return b.String()
}

func TestGoldenOverall(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			st := overallState()
			_, f := load(t, testConfig(layout), st)
			golden(t, "overall-"+string(layout)+"-dump", f.Dump())
			golden(t, "overall-"+string(layout)+"-trace", traceTable(t, f, st))
		})
	}
}
