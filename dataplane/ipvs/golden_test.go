package ipvs

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/sim/cluster"
)

// overallState is the kit's overall fixture with the difference IPVS
// mode makes visible: svc9, a NodePort, has internalTrafficPolicy Local and
// no local endpoint, so IPVS falls back to the cluster's endpoints
// (kube-proxy PR #97081). svc5 (ClusterIP only, no local endpoint) has no
// fallback and no real server; svc6 is a virtual server without real
// servers.
func overallState() *cluster.State {
	st := dataplanetest.OverallState()
	st.Services[name("ns9", "svc9", "")].InternalLocal = true
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
	golden(t, "overall-plan", planText(r.Render(overallState())))
}

// TestOverallDumpGolden syncs the overall state into the fakes and compares
// the backend's Dump (ipvsadm -Ln, kube-ipvs0, ipsets, iptables) with the
// golden file.
func TestOverallDumpGolden(t *testing.T) {
	f := newFakes(t, testConfig())
	f.sync(t, overallState(), true)
	golden(t, "overall-dump", f.dump(t))
}

func TestJumpRulesGolden(t *testing.T) {
	golden(t, "jumps", JumpRules())
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
	golden(t, "schedulers", b.String())
}
