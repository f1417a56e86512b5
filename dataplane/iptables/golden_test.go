package iptables

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
)

// overallState is the kit's overall fixture as it is: one Service of each
// kind the layout distinguishes (svc5 DROP, svc6 REJECT).
var overallState = dataplanetest.OverallState

// traceTable traces the kit's flows of st (pod, external and host clients
// to every cluster IP and node port), one line per flow.
func traceTable(t *testing.T, f *Fake, st *cluster.State) string {
	var b strings.Builder
	for _, fl := range dataplanetest.Flows(st) {
		res, err := f.Trace(fl.Src, fl.Proto, fl.Dst.Addr(), int(fl.Dst.Port()), nil)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s: %s\n", fl, res)
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

// TestLargeClusterCount: kube-proxy counts the endpoints of the service
// ports it proxies; endpoints whose Service is missing (a slice seen before
// its Service) do not push the node into large-cluster mode.
func TestLargeClusterCount(t *testing.T) {
	st := newState()
	sp := clusterIPPort(name("ns", "a", "p"), "172.30.0.70", 80)
	add(st, sp, ep("10.180.0.1", 80, otherNode, "R"), ep("10.180.0.2", 80, otherNode, "R"))
	orphan := name("ns", "orphan", "p")
	st.Endpoints[orphan] = []*cluster.Endpoint{ep("10.180.1.1", 80, otherNode, "R"), ep("10.180.1.2", 80, otherNode, "R")}
	cfg := testConfig()
	cfg.LargeClusterThreshold = 3
	_, _, rs := load(t, cfg, st)
	if !strings.Contains(rs.Restore, `"ns/a:p -> 10.180.0.1:80"`) {
		t.Errorf("2 proxied endpoints (threshold 3) rendered in large-cluster mode:\n%s", rs.Restore)
	}
	add(st, clusterIPPort(orphan, "172.30.0.71", 80), st.Endpoints[orphan]...)
	_, _, rs = load(t, cfg, st)
	if strings.Contains(rs.Restore, " -> ") {
		t.Errorf("4 proxied endpoints (threshold 3) rendered with per-endpoint comments:\n%s", rs.Restore)
	}
}

// TestHealthCheckNodePort: a LoadBalancer port with externalTrafficPolicy
// Local accepts its Service's healthCheckNodePort in filter KUBE-NODEPORTS,
// with or without local endpoints, as kube-proxy writes it.
func TestHealthCheckNodePort(t *testing.T) {
	for _, local := range []bool{true, false} {
		st := newState()
		sp := clusterIPPort(name("ns", "lb", "http"), "172.30.0.90", 80)
		sp.Type, sp.NodePort, sp.ExternalLocal, sp.HealthCheckNodePort = corev1.ServiceTypeLoadBalancer, 30081, true, 30900
		node := otherNode
		if local {
			node = thisNode
		}
		add(st, sp, ep("10.180.0.1", 80, node, "R"))
		f, _, rs := load(t, testConfig(), st)
		want := `-A KUBE-NODEPORTS -m comment --comment "ns/lb:http health check node port" -m tcp -p tcp --dport 30900 -j ACCEPT`
		if !strings.Contains(rs.Restore, "*filter\n") || !strings.Contains(f.Dump(), want+"\n") {
			t.Errorf("local endpoint %v: no %q in\n%s", local, want, f.Dump())
		}
	}
}

// TestTraceAgreesWithOracle: every flow of the overall fixture (pod, host
// and outside clients, a client outside the source ranges, to cluster IPs,
// node ports, external and load-balancer IPs) reaches the endpoints the
// oracle expects, masqueraded exactly where it expects the node's address;
// under each fault of external traffic some flow does not.
func TestTraceAgreesWithOracle(t *testing.T) {
	st := overallState()
	for _, fault := range []proxy.Fault{"", proxy.FaultLocalMasquerade, proxy.FaultLocalIgnored, proxy.FaultSourceRangesOpen} {
		f, _, _ := load(t, testConfig(fault), st)
		var bad []string
		for _, fl := range dataplanetest.Flows(st) {
			res, err := f.Trace(fl.Src, fl.Proto, fl.Dst.Addr(), int(fl.Dst.Port()), nil)
			if err != nil {
				t.Fatal(err)
			}
			if want, ok := expectFlow(cluster.ModeIPTables, st, fl); ok {
				if msg := dataplanetest.Agree(fl, res, want); msg != "" {
					bad = append(bad, msg)
				}
			}
		}
		switch {
		case fault == "" && len(bad) > 0:
			t.Errorf("the traces disagree with the oracle:\n%s", strings.Join(bad, "\n"))
		case fault != "" && len(bad) == 0:
			t.Errorf("fault %s: every trace agrees with the oracle", fault)
		}
	}
}

// expectFlow is the oracle's expectation for a flow of the kit (false for a
// destination kube-proxy writes no rule for).
func expectFlow(mode cluster.Mode, st *cluster.State, fl dataplanetest.Flow) (dataplanetest.Expected, bool) {
	sp := st.Services[fl.Name]
	from, via, ok := dataplanetest.StandpointOf(fl, sp)
	if !ok {
		return dataplanetest.Expected{}, false
	}
	want := oracle.Oracle{}.ExpectFrom(mode, sp, st.Endpoints[fl.Name], from, via, st.Nodes[thisNode].Zone)
	return dataplanetest.Expected{Outcome: want.String(), Reason: want.Reason,
		Masq: func(e string) bool { return want.SourceOf(e) == oracle.SourceNode }}, true
}
