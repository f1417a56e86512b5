package diagnose

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// localDump is one node's iptables dump of a Local LoadBalancer port
// whose KUBE-SVL chain counted counts per local pod (pods 10.244.N.I).
func localDump(node int, counts ...uint64) *Dump {
	sp := &ServicePort{Name: "demo/web:http", ClusterIP: netip.MustParseAddr("10.96.0.130"), Port: 80, Protocol: "tcp",
		Chain: "KUBE-SVC-WEB", Scheduler: "cascade", Exact: true, Endpoints: []*Endpoint{}}
	xp := &ExternalPath{Chain: "KUBE-EXT-WEB", Local: true, Counted: CountedApart, Endpoints: []*Endpoint{}}
	for i, n := range counts {
		ap := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(node), byte(20 + i)}), 8080)
		xp.Endpoints = append(xp.Endpoints, &Endpoint{Addr: ap, Chain: fmt.Sprintf("KUBE-SEP-%d%d", node, i), P: 1 / float64(len(counts)), Observed: n})
		xp.Outside += n
	}
	sp.Frontends = []Frontend{{What: "load-balancer IP", Addr: netip.MustParseAddr("192.0.2.130"), Port: 80, Chain: "KUBE-EXT-WEB", Local: true, Packets: xp.Outside}}
	sp.External = xp
	return &Dump{File: fmt.Sprintf("node-%d.save", node), Format: FormatIPTablesSave, Mode: "iptables", Counters: true, Ports: []*ServicePort{sp}}
}

// threeNodes analyses node 2's dump (three pods) with nodes 0 and 1 as
// peers.
func threeNodes(a, b, c []uint64) *Report {
	return Analyze(localDump(2, c...), Options{Node: "node-c", Peers: []Peer{{Node: "node-a", Dump: localDump(0, a...)}, {Node: "node-b", Dump: localDump(1, b...)}}})
}

// TestPlacementCauses: 1, 2 and 3 pods of a Local port on three nodes.
// An even balancer with even splits inside each node: placement explains
// the 3:1 imbalance. Node totals that follow neither an even nor a
// pod-weighted balancer: a finding about the balancer. Totals in
// proportion to the pods: the pods are even, explained by the balancer.
// A skew inside one node (rules fair): a skew finding on that node's
// split, and the placement names the rules.
func TestPlacementCauses(t *testing.T) {
	for _, c := range []struct {
		name     string
		a, b, cc []uint64
		cause    string
		finding  string
		explain  string
		balancer string
	}{
		{"even", []uint64{3000}, []uint64{1480, 1520}, []uint64{990, 1030, 1005}, "placement", "", KindLocalPlacement, "even"},
		{"uneven balancer", []uint64{6000}, []uint64{1500, 1500}, []uint64{1000, 1000, 1000}, "balancer", KindUnevenBalancer, "", "uneven"},
		{"weighted balancer", []uint64{2000}, []uint64{1990, 2010}, []uint64{2000, 1980, 2020}, "none", "", KindWeightedBalancer, "weighted by local pods"},
		{"skew in a node", []uint64{3000}, []uint64{1500, 1500}, []uint64{1500, 1000, 500}, "rules", KindSkew, "", "even"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := threeNodes(c.a, c.b, c.cc)
			if len(r.Placement) != 1 {
				t.Fatalf("placements %d", len(r.Placement))
			}
			pl := r.Placement[0]
			if pl.Cause != c.cause || pl.Balancer != c.balancer {
				t.Fatalf("cause %q balancer %q (even p %v, weighted p %v), want %q %q: %s", pl.Cause, pl.Balancer, pl.EvenP, pl.WeightedP, c.cause, c.balancer, pl.Message)
			}
			findings, explained := findingKinds(r, LevelFinding), findingKinds(r, LevelExplanation)
			if (c.finding == "") != (len(findings) == 0) || (c.finding != "" && !strings.HasPrefix(strings.Join(findings, ","), c.finding)) {
				t.Errorf("findings %v, want %q", findings, c.finding)
			}
			if c.explain != "" && !slices.ContainsFunc(explained, func(s string) bool { return strings.HasPrefix(s, c.explain) }) {
				t.Errorf("explanations %v, want %q", explained, c.explain)
			}
			if c.finding == KindSkew && findings[0] != KindSkew+" demo/web:http (external, Local, node-c)" {
				t.Errorf("the skew is named on %q", findings[0])
			}
			for _, f := range r.Findings {
				if f.Kind == KindUnevenBalancer && f.About != AboutBalancer {
					t.Errorf("uneven balancer about %q", f.About)
				}
			}
		})
	}
}

// TestExternalSplitTested: a Local split counted apart joins the Holm
// family; the port's cluster IP (no counts) does not, and its own
// endpoints are not the Local ones.
func TestExternalSplitTested(t *testing.T) {
	r := Analyze(localDump(2, 990, 1030, 1005), Options{})
	if len(r.External) != 1 || r.External[0].Split == nil || r.Tested != 1 || r.External[0].Verdict != "fair" {
		t.Fatalf("external %+v tested %d", r.External, r.Tested)
	}
	if len(r.Placement) != 0 {
		t.Errorf("one node, no API: no placement, got %d", len(r.Placement))
	}
	sp := r.External[0].Split
	if sp.N != 3025 || sp.Label() != "demo/web:http (external, Local)" || !sp.Power.Valid() {
		t.Errorf("split n %d label %q power %v", sp.N, sp.Label(), sp.Power)
	}
}
