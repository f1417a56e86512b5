package conform

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/topology"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/scenario"
)

// TestClientNodes: the harness evaluates a check from the shared
// definition (scenario.Check.Nodes) with the check's service port resolved
// in the state: a client restricted to another Service's port or protocol
// does not count, and a check that does not resolve falls back to the port
// it names.
func TestClientNodes(t *testing.T) {
	all := []string{"node-a", "node-b", "node-c"}
	st := &cluster.State{Services: map[cluster.ServicePortName]*cluster.ServicePort{
		{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "dns", Protocol: corev1.ProtocolUDP}: {},
	}}
	sc := &scenario.Scenario{Traffic: &scenario.Traffic{Clients: []scenario.Client{
		{Name: "tcp", Nodes: []string{"node-a"}, Protocol: "TCP"},
		{Name: "udp", Nodes: []string{"node-b"}, Protocol: "UDP"},
		{Name: "other", Nodes: []string{"node-c"}, Services: []string{"ns/other"}},
	}}}
	c := &scenario.Check{Service: "ns/web"}
	if d := cmp.Diff([]string{"node-b"}, clientNodes(sc, c, all, st)); d != "" {
		t.Errorf("resolved (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string(nil), clientNodes(sc, &scenario.Check{Service: "ns/none"}, all, st)); d != "" {
		t.Errorf("unresolved (-want +got):\n%s", d)
	}
}

// TestClientNodesDefault: on every conformance scenario, a check without
// clientNodes is evaluated from exactly the nodes where the topology the
// suite builds (topology.FromModel) places client pods (no conformance
// scenario restricts a client's services or protocol, so every client pod
// sends to every checked port). Among them are scenarios whose clients are
// on some nodes only, so a default of "every node" would fail here.
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
			st, err := initialState(m.Loaded, nil)
			if err != nil {
				t.Fatal(err)
			}
			var all, withPods []string
			for _, n := range cfg.Nodes {
				all = append(all, n.Name)
				if slices.ContainsFunc(n.Clients, func(c netns.ClientConfig) bool { return !c.Endpoint }) {
					withPods = append(withPods, n.Name)
				}
			}
			slices.Sort(withPods)
			sc := m.Loaded.Scenario
			for i := range sc.Checks {
				c := &sc.Checks[i]
				if from, _ := scenario.CheckRoute(c); len(c.ClientNodes) > 0 || from != cluster.InPod || c.Type == scenario.CheckHairpin {
					continue // clients outside the cluster enter at every node; hairpin runs where the endpoints are
				}
				defaults++
				if len(withPods) < len(all) {
					partial++
				}
				if d := cmp.Diff(withPods, clientNodes(sc, c, all, st)); d != "" {
					t.Errorf("check %q: nodes (-nodes with client pods +clientNodes):\n%s", c.Name, d)
				}
			}
		})
	}
	if defaults == 0 || partial == 0 {
		t.Errorf("%d checks use the default and %d of them in a scenario with clients on some nodes only: the test would not notice a wrong default", defaults, partial)
	}
}
