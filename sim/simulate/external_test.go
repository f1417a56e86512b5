package simulate

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/engine"
	"github.com/kpsim/kpsim/sim/report"
	"github.com/kpsim/kpsim/sim/scenario"
)

const placementScenario = "../../scenarios/external-placement.yaml"

func externalService(t *testing.T, e *report.External, port string) *report.ExternalService {
	t.Helper()
	for i := range e.Services {
		if e.Services[i].ServicePort == port {
			return &e.Services[i]
		}
	}
	t.Fatalf("no external destination %s in the report", port)
	return nil
}

// TestExternalPlacementShares: a load balancer over three nodes holding 1,
// 2 and 3 pods. Under externalTrafficPolicy Local the oracle expects 1/3,
// 1/6, 1/6, 1/9, 1/9, 1/9 and under Cluster 1/6 each, and every mode's
// shares hold them inside their intervals; the Local pod alone on its node
// is three times as busy as a pod of the fullest node.
func TestExternalPlacementShares(t *testing.T) {
	r := simulate(t, placementScenario, nil, Options{})
	e := r.External
	if e == nil {
		t.Fatal("no external section")
	}
	for _, tc := range []struct {
		port, policy string
		via          cluster.Via
		want         []float64
		ratio        float64
	}{
		{"demo/shop:http", "Local", cluster.ViaLoadBalancer, []float64{1. / 3, 1. / 6, 1. / 6, 1. / 9, 1. / 9, 1. / 9}, 3},
		{"demo/catalog:http", "Cluster", cluster.ViaNodePort, []float64{1. / 6, 1. / 6, 1. / 6, 1. / 6, 1. / 6, 1. / 6}, 1},
	} {
		s := externalService(t, e, tc.port)
		if s.Policy != tc.policy || s.Via != tc.via || len(s.Pods) != len(tc.want) {
			t.Fatalf("%s: policy %s via %s with %d pods, want %s via %s with %d", tc.port, s.Policy, s.Via, len(s.Pods), tc.policy, tc.via, len(tc.want))
		}
		for i, p := range s.Pods {
			if math.Abs(p.Expected-tc.want[i]) > 1e-9 {
				t.Errorf("%s pod %s: expected share %.4f, want %.4f", tc.port, p.Endpoint, p.Expected, tc.want[i])
			}
		}
		if math.Abs(s.Expected-tc.ratio) > 1e-9 || math.Abs(s.ExpectedLocal-3) > 1e-9 || math.Abs(s.ExpectedCluster-1) > 1e-9 {
			t.Errorf("%s: expected busiest/idlest %.3f (Local %.3f, Cluster %.3f), want %.0f (3, 1)", tc.port, s.Expected, s.ExpectedLocal, s.ExpectedCluster, tc.ratio)
		}
		for _, m := range s.Modes {
			if !m.Within || m.Sample < 50000 {
				t.Errorf("%s %s: within intervals %v over %d connections: %v [%v, %v]", tc.port, m.Mode, m.Within, m.Sample, m.Shares, m.Low, m.High)
			}
		}
	}
	if got := externalService(t, e, "demo/shop:http").Source; got != "client" {
		t.Errorf("Local destination: pods see the %s address, want the client's", got)
	}
	if got := externalService(t, e, "demo/catalog:http").Source; got != "node" {
		t.Errorf("Cluster destination: pods see the %s address, want a node's (SNAT)", got)
	}
}

// TestExternalHealthCheckLag: shop's only pod on node-1 is deleted at 40 s
// without a grace period. The balancer probes every 8 s from a drawn phase
// and takes a node out after 3 failures, so it notices between 16 and 24 s
// later; meanwhile node-1 gets a third of shop's connections, which
// iptables and nftables drop and ipvs forwards without SNAT (replies lost).
func TestExternalHealthCheckLag(t *testing.T) {
	r := simulate(t, placementScenario, nil, Options{})
	lags := r.External.Lags
	if len(lags) != 1 {
		t.Fatalf("%d health-check lags, want 1: %+v", len(lags), lags)
	}
	l := lags[0]
	if l.Node != "node-1" || !l.Noticed || l.AtSeconds != 40 || l.LagSeconds < 16 || l.LagSeconds >= 24 {
		t.Fatalf("lag %+v: want node-1 at 40 s, taken out 16-24 s later", l)
	}
	// 2,000 connections/s to shop, a third to node-1.
	if want := 2000.0 / 3 * l.LagSeconds; math.Abs(l.Expected-want) > 2 {
		t.Errorf("expected %.0f connections in the lag, want %.0f", l.Expected, want)
	}
	// The balancer's node counts are deterministic, but each connection's
	// Service is drawn: binomial noise, under 5 standard deviations.
	for _, m := range l.Modes {
		if math.Abs(float64(m.Connections)-l.Expected) > 5*math.Sqrt(l.Expected) {
			t.Errorf("%s: %d connections in the lag, expected %.0f", m.Mode, m.Connections, l.Expected)
		}
		failed := m.Dropped + m.Lost + m.Misrouted
		if failed != m.Connections {
			t.Errorf("%s: %d of %d lag connections failed (dropped %d, lost %d, misrouted %d), want all", m.Mode, failed, m.Connections, m.Dropped, m.Lost, m.Misrouted)
		}
		if (m.Mode == cluster.ModeIPVS) != (m.Lost > 0) || (m.Mode == cluster.ModeIPVS) == (m.Dropped > 0) {
			t.Errorf("%s: dropped %d, replies lost %d: want drops in iptables and nftables, lost replies in ipvs", m.Mode, m.Dropped, m.Lost)
		}
	}
}

// TestExternalSelfCheckFault: the engine self-check covers the external
// destinations. With only outside clients, iptables' uniform-probability
// fault (visible with three or more endpoints) is rejected on them.
func TestExternalSelfCheckFault(t *testing.T) {
	r := simulate(t, placementScenario, nil, Options{Modes: []cluster.Mode{cluster.ModeIPTables}, Fault: engine.FaultUniformProbability.String()})
	sc := r.Modes[0].SelfCheck
	if sc.Verdict != report.Fail || sc.Rejected == 0 {
		t.Fatalf("self-check with the fault: %s, %d rejected", sc.Verdict, sc.Rejected)
	}
	for _, p := range sc.RejectedServicePorts {
		if !strings.Contains(p, " via ") {
			t.Errorf("rejected %s: only external destinations have traffic", p)
		}
	}
	clean := simulate(t, placementScenario, nil, Options{Modes: []cluster.Mode{cluster.ModeIPTables}})
	if sc := clean.Modes[0].SelfCheck; sc.Verdict != report.Pass || sc.ServicePorts != 2 {
		t.Fatalf("self-check without the fault: %s over %d service ports, want a pass over the 2 destinations", sc.Verdict, sc.ServicePorts)
	}
}

// TestExternalModeAlone: a mode simulated alone gives exactly its part of
// a full run, external section included (the balancer's plan and the
// streams do not depend on the modes).
func TestExternalModeAlone(t *testing.T) {
	full := simulate(t, placementScenario, nil, Options{})
	alone := simulate(t, placementScenario, nil, Options{Modes: []cluster.Mode{cluster.ModeNFTables}})
	pick := func(r *report.Report) []report.ExternalModeShares {
		var out []report.ExternalModeShares
		for _, s := range r.External.Services {
			for _, m := range s.Modes {
				if m.Mode == cluster.ModeNFTables {
					out = append(out, m)
				}
			}
		}
		return out
	}
	if a, b := encode(t, pick(full)), encode(t, pick(alone)); !bytes.Equal(a, b) {
		t.Fatalf("nftables alone differs from its part of the full run:\n%s\n%s", a, b)
	}
}

// TestExternalUnreachableTarget: a generated Service's node port is known
// only once expanded; an outside client naming one without it is bad input
// at its line, found before anything runs.
func TestExternalUnreachableTarget(t *testing.T) {
	file := filepath.Join(t.TempDir(), "unreachable.yaml")
	doc := `apiVersion: kpsim.dev/v1alpha1
kind: Scenario
metadata: {name: unreachable}
cluster: {nodeCount: 2}
generate:
  services: 3
  endpointsPerService: {kind: fixed, value: 2}
traffic:
  clients:
    - name: internet
      where: external
      services: [default/svc-1]
  connections: 1000
`
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := apiserver.Open(context.Background(), file, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	_, err = Run(context.Background(), m, Options{})
	if !scenario.IsInvalid(err) || !strings.Contains(err.Error(), file+":12:18: traffic.clients[0].services[0]: default/svc-1 has no service port reachable through load-balancer") {
		t.Fatalf("got %v, want bad input at traffic.clients[0].services[0] (line 12)", err)
	}
}
