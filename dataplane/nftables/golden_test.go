package nftables

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/dataplane/trace"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
)

// overallState is the kit's overall fixture with one Service the layouts
// also distinguish: svc13, a NodePort with externalTrafficPolicy Local
// without a local endpoint.
func overallState() *cluster.State {
	st := dataplanetest.OverallState()
	sp13 := clusterIPPort(name("ns13", "svc13", "p80"), "172.30.0.53", 80)
	sp13.Type, sp13.NodePort, sp13.ExternalLocal = corev1.ServiceTypeNodePort, 30013, true
	add(st, sp13, ep("10.180.0.21", 80, otherNode, "R"))
	return st
}

// traceTable traces the kit's flows of st (pod, external and host clients
// to every cluster IP and node port), one line per flow.
func traceTable(t *testing.T, f *knftables.Fake, st *cluster.State) string {
	t.Helper()
	tr := tracer(t, f)
	var b strings.Builder
	for _, fl := range dataplanetest.Flows(st) {
		res, err := tr.Trace(trace.Packet{Src: fl.Src, Protocol: fl.Proto, Dst: fl.Dst.Addr(), DPort: int(fl.Dst.Port())}, nil)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s: %s\n", fl, res)
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

// TestTraceAgreesWithOracle: in both layouts, every flow of the overall
// fixture (pod, host and outside clients, a client outside the source
// ranges, to cluster IPs, node ports, external and load-balancer IPs)
// reaches the endpoints the oracle expects, masqueraded exactly where it
// expects the node's address; under each fault of external traffic some
// flow does not.
func TestTraceAgreesWithOracle(t *testing.T) {
	st := overallState()
	for _, layout := range layouts {
		for _, fault := range []proxy.Fault{"", proxy.FaultLocalMasquerade, proxy.FaultLocalIgnored, proxy.FaultSourceRangesOpen} {
			_, f := load(t, testConfig(layout, fault), st)
			tr := tracer(t, f)
			var bad []string
			for _, fl := range dataplanetest.Flows(st) {
				res, err := tr.Trace(trace.Packet{Src: fl.Src, Protocol: fl.Proto, Dst: fl.Dst.Addr(), DPort: int(fl.Dst.Port())}, nil)
				if err != nil {
					t.Fatal(err)
				}
				sp := st.Services[fl.Name]
				from, via, ok := dataplanetest.StandpointOf(fl, sp)
				if !ok {
					continue
				}
				want := oracle.Oracle{}.ExpectFrom(cluster.ModeNFTables, sp, st.Endpoints[fl.Name], from, via, st.Nodes[thisNode].Zone)
				exp := dataplanetest.Expected{Outcome: want.String(), Reason: want.Reason,
					Masq: func(e string) bool { return want.SourceOf(e) == oracle.SourceNode }}
				if msg := dataplanetest.Agree(fl, res, exp); msg != "" {
					bad = append(bad, msg)
				}
			}
			switch {
			case fault == "" && len(bad) > 0:
				t.Errorf("%s layout: the traces disagree with the oracle:\n%s", layout, strings.Join(bad, "\n"))
			case fault != "" && len(bad) == 0:
				t.Errorf("%s layout, fault %s: every trace agrees with the oracle", layout, fault)
			}
		}
	}
}
