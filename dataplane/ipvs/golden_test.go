package ipvs

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/sim/cluster"
)

// overallState is one node's view of a cluster with one Service of each kind
// the IPVS mode distinguishes (the iptables backend's overall fixture).
func overallState() *cluster.State {
	st := newState()
	// svc1: one endpoint on another node.
	add(st, clusterIPPort(name("ns1", "svc1", "p80"), "172.30.0.41", 80), ep("10.180.0.1", 80, otherNode, "R"))
	// svc2: three ready endpoints and one not ready (left out).
	add(st, clusterIPPort(name("ns2", "svc2", "p80"), "172.30.0.42", 80),
		ep("10.180.0.4", 80, otherNode, "R"), ep("10.180.0.5", 80, thisNode, "R"), ep("10.180.0.6", 80, thisNode, ""), ep("10.180.1.7", 80, otherNode, "R"))
	// svc3: ClientIP affinity: persistence.
	sp3 := clusterIPPort(name("ns3", "svc3", "p80"), "172.30.0.43", 80)
	sp3.ClientIPAffinity, sp3.AffinityTimeout = true, 10800
	add(st, sp3, ep("10.180.0.3", 80, otherNode, "R"), ep("10.180.2.3", 80, thisNode, "R"))
	// svc4: internalTrafficPolicy Local with a local endpoint.
	sp4 := clusterIPPort(name("ns4", "svc4", "p80"), "172.30.0.44", 80)
	sp4.InternalLocal = true
	add(st, sp4, ep("10.180.0.8", 80, thisNode, "R"), ep("10.180.0.9", 80, otherNode, "R"))
	// svc5: internalTrafficPolicy Local without one, ClusterIP only: the
	// fallback (cluster endpoints) is empty, no real server.
	sp5 := clusterIPPort(name("ns5", "svc5", "p80"), "172.30.0.45", 80)
	sp5.InternalLocal = true
	add(st, sp5, ep("10.180.0.10", 80, otherNode, "R"))
	// svc6: no endpoints: a virtual server without real servers.
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
	// svc9: NodePort with internalTrafficPolicy Local and no local
	// endpoint: reachable from outside, so IPVS falls back to the cluster's
	// endpoints (kube-proxy PR #97081).
	sp9 := clusterIPPort(name("ns9", "svc9", ""), "172.30.0.49", 8080)
	sp9.Type, sp9.NodePort, sp9.InternalLocal = corev1.ServiceTypeNodePort, 30080, true
	add(st, sp9, ep("10.180.0.15", 8080, otherNode, "R"))
	return st
}

// planText prints a plan: virtual servers, bound addresses, set entries,
// counters and the iptables-restore text.
func planText(p *Plan) string {
	var b strings.Builder
	for _, v := range p.Servers {
		fmt.Fprintf(&b, "%s %s sched=%s flags=%#x timeout=%d bind=%v\n", v.Key, v.ServicePort, v.Scheduler, v.Flags, v.Timeout, v.Bind)
		for _, d := range v.Dests {
			fmt.Fprintf(&b, "  -> %s weight %d\n", d.Addr, d.Weight)
		}
	}
	fmt.Fprintf(&b, "bind %v\n", p.Bind)
	for _, n := range SetNames() {
		if len(p.Sets[n]) > 0 {
			fmt.Fprintf(&b, "set %s %v\n", n, p.Sets[n])
		}
	}
	fmt.Fprintf(&b, "noLocalEndpoints %v\n", p.NoLocalEndpoints)
	b.WriteString(p.Restore)
	return b.String()
}

func TestOverallPlanGolden(t *testing.T) {
	r, err := NewRenderer(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "overall-plan.golden", planText(r.Render(overallState())))
}

// TestOverallDumpGolden syncs the overall state into the fakes and compares
// the backend's Dump (ipvsadm -Ln, kube-ipvs0, ipsets, iptables) with the
// golden file.
func TestOverallDumpGolden(t *testing.T) {
	f := newFakes(t, testConfig())
	f.sync(t, overallState(), true)
	golden(t, "overall-dump.golden", f.dump(t))
}

func TestJumpRulesGolden(t *testing.T) {
	golden(t, "jumps.golden", JumpRules())
}

func TestSchedulerFlagsGolden(t *testing.T) {
	var b strings.Builder
	for _, s := range Schedulers {
		cfg := testConfig()
		cfg.Scheduler = s
		f := newFakes(t, cfg)
		st := newState()
		sp := clusterIPPort(name("ns", "web", "http"), "172.30.0.10", 80)
		sp.ClientIPAffinity, sp.AffinityTimeout = true, 30
		add(st, sp, ep("10.180.0.1", 8080, thisNode, "R"), ep("10.180.0.2", 8080, otherNode, "R"))
		f.sync(t, st, true)
		b.WriteString(f.ipvs.Dump())
	}
	golden(t, "schedulers.golden", b.String())
}
