package conform

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kpsim/kpsim/harness/topology"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/scenario"
)

// TestClientNodes: a check is evaluated from its clientNodes when it names
// them; by default from every node that has a client pod (a client without
// nodes has pods on every node), each once, sorted; with no clients, from
// none.
func TestClientNodes(t *testing.T) {
	all := []string{"node-a", "node-b", "node-c"}
	traffic := func(clients ...scenario.Client) *scenario.Scenario {
		return &scenario.Scenario{Traffic: &scenario.Traffic{Clients: clients}}
	}
	for _, tc := range []struct {
		name  string
		sc    *scenario.Scenario
		check scenario.Check
		want  []string
	}{
		{"default: the client's node only, not every node",
			traffic(scenario.Client{Name: "c", Nodes: []string{"node-b"}}), scenario.Check{}, []string{"node-b"}},
		{"default: a client without nodes is on every node",
			traffic(scenario.Client{Name: "c"}), scenario.Check{}, all},
		{"default: the union of the clients, each node once, sorted",
			traffic(scenario.Client{Name: "x", Nodes: []string{"node-c", "node-a"}}, scenario.Client{Name: "y", Nodes: []string{"node-a"}}),
			scenario.Check{}, []string{"node-a", "node-c"}},
		{"default: no traffic section, no client node",
			&scenario.Scenario{}, scenario.Check{}, nil},
		{"the check's clientNodes win over the clients",
			traffic(scenario.Client{Name: "c"}), scenario.Check{ClientNodes: []string{"node-c"}}, []string{"node-c"}},
		{"the check's clientNodes keep their order",
			traffic(scenario.Client{Name: "c", Nodes: []string{"node-a"}}), scenario.Check{ClientNodes: []string{"node-c", "node-b"}}, []string{"node-c", "node-b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, clientNodes(tc.sc, &tc.check, all)); d != "" {
				t.Errorf("clientNodes (-want +got):\n%s", d)
			}
		})
	}
}

// TestClientNodesDefault: on every conformance scenario, a check without
// clientNodes is evaluated from exactly the nodes where the topology the
// suite builds (topology.FromModel) places client pods. Among them are
// scenarios whose clients are on some nodes only, so a default of "every
// node" would fail here.
func TestClientNodesDefault(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(conformanceDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	more, err := filepath.Glob(filepath.Join(conformanceDir, "*", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, more...)
	if len(files) == 0 {
		t.Fatalf("no scenario in %s", conformanceDir)
	}
	defaults, partial := 0, 0
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			m, err := apiserver.Open(context.Background(), f, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(m.Close)
			cfg, err := topology.FromModel(m, "")
			if err != nil {
				t.Fatal(err)
			}
			var all, withPods []string
			for _, n := range cfg.Nodes {
				all = append(all, n.Name)
				if len(n.Clients) > 0 {
					withPods = append(withPods, n.Name)
				}
			}
			slices.Sort(withPods)
			sc := m.Loaded.Scenario
			for i := range sc.Checks {
				c := &sc.Checks[i]
				if len(c.ClientNodes) > 0 {
					continue
				}
				defaults++
				if len(withPods) < len(all) {
					partial++
				}
				if d := cmp.Diff(withPods, clientNodes(sc, c, all)); d != "" {
					t.Errorf("check %q: nodes (-nodes with client pods +clientNodes):\n%s", c.Name, d)
				}
			}
		})
	}
	if defaults == 0 || partial == 0 {
		t.Errorf("%d checks use the default and %d of them in a scenario with clients on some nodes only: the test would not notice a wrong default", defaults, partial)
	}
}
