package simulate

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/report"
	"github.com/kpsim/kpsim/sim/scenario"
)

// TestSeedsResolveChecks runs the checks of scenarios/1000-services.yaml
// for seeds 1..50 through Run, the code behind sim run. The seed drives
// the generator, which names svc-1's one port p80 for some seeds and
// leaves it unnamed for others; the checks name no port and must find it
// either way (they once failed for seeds 1, 4, 7, 11, ...). The whole
// scenario is simulated (1000 Services, its events) with its traffic
// scaled down to 200,000 connections sent to the checked Services only,
// in one mode per seed, taken in turn (resolution does not depend on the
// mode; every mode still sees both namings), so that a seed costs about
// 0.15 s of CPU. The full traffic in every mode is TestRun1000Services's
// (cmd/sim/app) and `make run`'s.
func TestSeedsResolveChecks(t *testing.T) {
	const file = "../../scenarios/1000-services.yaml"
	const seeds = 50
	var mu sync.Mutex
	named, results := map[cluster.Mode]int{}, map[cluster.Mode]int{} // by mode
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
				// The pod clients send to the checked Services; the
				// clients outside the cluster (to the node ports) are left
				// out.
				var pods []scenario.Client
				for _, c := range sc.Traffic.Clients {
					if c.Where != cluster.Outside {
						c.Services = targets
						pods = append(pods, c)
					}
				}
				sc.Traffic.Clients = pods
				sc.Traffic.Connections = 200_000
				m, err := apiserver.OpenLoaded(context.Background(), l, &seed)
				if err != nil {
					t.Fatal(err)
				}
				mode := sc.Proxy.Modes[seed%uint64(len(sc.Proxy.Modes))]
				r, err := Run(context.Background(), m, Options{Modes: []cluster.Mode{mode}})
				m.Close()
				if err != nil {
					t.Fatal(err)
				}
				if want := len(sc.Checks); len(r.Modes) != 1 || len(r.Checks) != want || want == 0 {
					t.Fatalf("%d mode(s), %d check results; want 1 mode (%s), %d", len(r.Modes), len(r.Checks), mode, want)
				}
				for _, c := range r.Checks {
					mu.Lock()
					results[c.Mode]++
					if c.ServicePort == "ns-1/svc-1:p80" {
						named[c.Mode]++
					}
					mu.Unlock()
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
	// Worth something only if the seeds gave both namings of svc-1's port,
	// in every mode.
	if len(results) != 3 {
		t.Errorf("modes simulated: %v, want 3", results)
	}
	for mode, all := range results {
		if n := named[mode]; n == 0 || n == all {
			t.Errorf("%s: %d of %d check results on ns-1/svc-1:p80: the seeds did not exercise both namings", mode, n, all)
		}
	}
}
