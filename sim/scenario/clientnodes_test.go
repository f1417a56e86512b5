package scenario

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCheckNodes: a check is evaluated from its clientNodes when it names
// them; by default from every node that has a client pod sending to the
// checked service port (a client without nodes has pods on every node),
// each once, sorted; with no clients, from none.
func TestCheckNodes(t *testing.T) {
	all := []string{"node-a", "node-b", "node-c"}
	web := Target{Service: "demo/web", Port: "http", Protocol: "TCP"}
	traffic := func(clients ...Client) *Scenario {
		return &Scenario{Traffic: &Traffic{Clients: clients}}
	}
	for _, tc := range []struct {
		name  string
		sc    *Scenario
		check Check
		want  []string
	}{
		{"default: the client's node only, not every node",
			traffic(Client{Name: "c", Nodes: []string{"node-b"}}), Check{}, []string{"node-b"}},
		{"default: a client without nodes is on every node",
			traffic(Client{Name: "c"}), Check{}, all},
		{"default: the union of the clients, each node once, sorted",
			traffic(Client{Name: "x", Nodes: []string{"node-c", "node-a"}}, Client{Name: "y", Nodes: []string{"node-a"}}),
			Check{}, []string{"node-a", "node-c"}},
		{"default: no traffic section, no client node",
			&Scenario{}, Check{}, nil},
		{"default: a client of other Services does not count",
			traffic(Client{Name: "x", Nodes: []string{"node-a"}, Services: []string{"demo/api"}},
				Client{Name: "y", Nodes: []string{"node-b"}, Services: []string{"demo/api", "demo/web"}}),
			Check{}, []string{"node-b"}},
		{"default: a client of another port of the Service does not count",
			traffic(Client{Name: "x", Nodes: []string{"node-a"}, Services: []string{"demo/web:https"}},
				Client{Name: "y", Nodes: []string{"node-b"}, Services: []string{"demo/web:http"}}),
			Check{}, []string{"node-b"}},
		{"default: a client of the other protocol does not count",
			traffic(Client{Name: "x", Nodes: []string{"node-a"}, Protocol: "UDP"}, Client{Name: "y", Nodes: []string{"node-c"}, Protocol: "TCP"}),
			Check{}, []string{"node-c"}},
		{"the check's clientNodes win over the clients",
			traffic(Client{Name: "c"}), Check{ClientNodes: []string{"node-c"}}, []string{"node-c"}},
		{"the check's clientNodes keep their order",
			traffic(Client{Name: "c", Nodes: []string{"node-a"}}), Check{ClientNodes: []string{"node-c", "node-b"}}, []string{"node-c", "node-b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, tc.check.Nodes(tc.sc, all, web)); d != "" {
				t.Errorf("Nodes (-want +got):\n%s", d)
			}
		})
	}
}
