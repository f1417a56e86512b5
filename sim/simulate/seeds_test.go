package simulate

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/report"
	"github.com/kpsim/kpsim/sim/scenario"
)

// TestSeedsResolveChecks runs the checks of scenarios/1000-services.yaml
// for seeds 1..50 through Run, the code behind sim run. The seed drives
// the generator, which names svc-1's one port p80 for some seeds and
// leaves it unnamed for others; the checks name no port and must find it
// either way (they once failed for seeds 1, 4, 7, 11, ...). The whole
// scenario is simulated (1000 Services, its events, three modes) with its
// traffic scaled down to 200,000 connections sent to the checked Services
// only, so that a seed costs about 0.3 s of CPU; the full traffic is
// TestRun1000Services's (cmd/sim/app) and `make run`'s.
func TestSeedsResolveChecks(t *testing.T) {
	const file = "../../scenarios/1000-services.yaml"
	const seeds = 50
	var named, results atomic.Int64
	t.Run("seeds", func(t *testing.T) {
		for seed := uint64(1); seed <= seeds; seed++ {
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				t.Parallel()
				l, err := scenario.LoadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				sc := l.Scenario
				var targets []string
				for _, c := range sc.Checks {
					targets = append(targets, c.Service)
				}
				for i := range sc.Traffic.Clients {
					sc.Traffic.Clients[i].Services = targets
				}
				sc.Traffic.Connections = 200_000
				m, err := cluster.OpenLoaded(context.Background(), l, &seed)
				if err != nil {
					t.Fatal(err)
				}
				r, err := Run(context.Background(), m, Options{})
				m.Close()
				if err != nil {
					t.Fatal(err)
				}
				if want := len(sc.Checks) * len(r.Modes); len(r.Checks) != want || want == 0 {
					t.Fatalf("%d check results, want %d", len(r.Checks), want)
				}
				for _, c := range r.Checks {
					results.Add(1)
					if c.ServicePort == "ns-1/svc-1:p80" {
						named.Add(1)
					}
					if c.Verdict != report.Pass {
						t.Errorf("%s %s on %s: %s: %s", c.Mode, c.Name, c.ServicePort, c.Verdict, c.Message)
					}
				}
				if len(r.Failed) > 0 {
					t.Errorf("failed: %v", r.Failed)
				}
			})
		}
	})
	// Worth something only if the seeds gave both namings of svc-1's port.
	if n, all := named.Load(), results.Load(); n == 0 || n == all {
		t.Errorf("%d of %d check results on ns-1/svc-1:p80: the seeds did not exercise both namings", n, all)
	}
}
