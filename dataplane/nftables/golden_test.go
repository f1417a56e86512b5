package nftables

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane/dataplanetest"
	"github.com/kpsim/kpsim/dataplane/trace"
	"github.com/kpsim/kpsim/sim/cluster"
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
