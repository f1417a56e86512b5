package iptables

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/sim/cluster"
)

// overallState is one node's view of a cluster with one Service of each kind
// the layout distinguishes (kube-proxy's TestOverallIPTablesRules in spirit).
func overallState() *cluster.State {
	st := newState()
	// svc1: one endpoint.
	add(st, clusterIPPort(name("ns1", "svc1", "p80"), "172.30.0.41", 80), ep("10.180.0.1", 80, otherNode, "R"))
	// svc2: three endpoints, one not ready.
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
	// svc9: NodePort, Cluster policies.
	sp9 := clusterIPPort(name("ns9", "svc9", ""), "172.30.0.49", 8080)
	sp9.Type, sp9.NodePort = corev1.ServiceTypeNodePort, 30080
	add(st, sp9, ep("10.180.0.15", 8080, otherNode, "R"))
	return st
}

// traceTable traces pod, external and host clients to every cluster IP and
// node port of st, one line per flow.
func traceTable(t *testing.T, f *Fake, st *cluster.State) string {
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
				res, err := f.Trace(src, proto, d.Addr(), int(d.Port()), nil)
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
	st := overallState()
	f, _, rs := load(t, testConfig(), st)
	golden(t, "overall-restore", rs.Restore)
	golden(t, "overall-dump", f.Dump())
	golden(t, "overall-trace", traceTable(t, f, st))
	golden(t, "jumps", rs.Jumps)
	if rs.IPSetRestore != "" {
		t.Errorf("ipsets under the recent layout:\n%s", rs.IPSetRestore)
	}
}

func TestGoldenIPSetAffinity(t *testing.T) {
	st, _, _ := affinityState(600)
	cfg := testConfig()
	cfg.Affinity = AffinityIPSet
	f, _, rs := load(t, cfg, st)
	golden(t, "affinity-ipset-restore", rs.Restore)
	golden(t, "affinity-ipset-sets", rs.IPSetRestore)
	if got := f.DumpIPSets(); got != rs.IPSetRestore {
		t.Errorf("fake sets:\n%s\nwant:\n%s", got, rs.IPSetRestore)
	}
}

func TestGoldenMasqueradeAll(t *testing.T) {
	st := newState()
	add(st, clusterIPPort(name("ns1", "svc1", "p80"), "172.30.0.41", 80), ep("10.180.0.1", 80, otherNode, "R"))
	cfg := testConfig()
	cfg.MasqueradeAll = true
	f, _, rs := load(t, cfg, st)
	if !strings.Contains(rs.Restore, `--dport 80 -j KUBE-MARK-MASQ`) {
		t.Errorf("no masquerade-all rule:\n%s", rs.Restore)
	}
	if got := targets(tracePacket(t, f, podIP, "172.30.0.41", 80, nil)); got != "10.180.0.1:80 masq" {
		t.Errorf("pod traffic with masqueradeAll: %q", got)
	}
	// Without a local-traffic detector there is no masquerade rule at all.
	cfg = testConfig()
	cfg.ClusterCIDR = netip.Prefix{}
	_, _, rs = load(t, cfg, st)
	if strings.Contains(rs.Restore, "cluster IP\" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s") {
		t.Errorf("masquerade rule without a pod CIDR:\n%s", rs.Restore)
	}
}

// TestLargeClusterComments: above the threshold, per-endpoint comments go.
func TestLargeClusterComments(t *testing.T) {
	st := overallState()
	cfg := testConfig()
	cfg.LargeClusterThreshold = 3
	_, _, rs := load(t, cfg, st)
	for _, l := range strings.Split(rs.Restore, "\n") {
		if (strings.HasPrefix(l, "-A KUBE-SEP-") || strings.HasPrefix(l, "-A KUBE-SVC-")) && strings.Contains(l, " -> ") {
			t.Fatalf("per-endpoint comment in large-cluster mode: %s", l)
		}
		if strings.HasPrefix(l, "-A KUBE-SEP-") && strings.Contains(l, "--comment") {
			t.Fatalf("service comment in a SEP chain in large-cluster mode: %s", l)
		}
	}
	if !strings.Contains(rs.Restore, `"ns1/svc1:p80 cluster IP"`) {
		t.Error("the cluster IP comment must stay")
	}
}
