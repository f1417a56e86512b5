package conform

import (
	"context"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/ipvs"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// TestNodePortServiceWithoutNodePort is the code review's probe P2, from
// the scenario file to the IPVS plan: a type NodePort Service whose port
// names no nodePort, internalTrafficPolicy Local, endpoints only on another
// node. The expansion gives the port a node port as the API server does, so
// the service port is reachable from outside and both the real IPVS
// renderer and the oracle fall back to the cluster's endpoints (PR #97081).
// Before, the port had no node port: the dataplane programmed no real
// server (REJECT) while the oracle expected the cluster's endpoints.
func TestNodePortServiceWithoutNodePort(t *testing.T) {
	l, err := scenario.Load("p2.yaml", []byte(`apiVersion: kpsim.dev/v1alpha1
kind: Scenario
metadata: {name: p2}
cluster:
  nodes: [{name: node-a}, {name: node-b}]
objects:
- apiVersion: v1
  kind: Service
  metadata: {name: np, namespace: demo}
  spec:
    type: NodePort
    clusterIP: 10.96.0.50
    internalTrafficPolicy: Local
    ports: [{name: http, port: 80, targetPort: 8080}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: np-abcde, namespace: demo, labels: {kubernetes.io/service-name: np}}
  addressType: IPv4
  ports: [{name: http, port: 8080}]
  endpoints:
  - {addresses: ["10.244.1.2"], nodeName: node-b}
  - {addresses: ["10.244.1.3"], nodeName: node-b}
`))
	if err != nil {
		t.Fatal(err)
	}
	m, err := apiserver.OpenLoaded(context.Background(), l, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	st := m.State
	names := st.SortedServicePorts()
	if len(names) != 1 {
		t.Fatalf("service ports %v, want one", names)
	}
	spn := names[0]
	sp := st.Services[spn]
	if sp.NodePort != scenario.NodePortMin {
		t.Fatalf("node port %d, want %d, the first of the range", sp.NodePort, scenario.NodePortMin)
	}

	r, err := ipvs.NewRenderer(ipvs.Config{NodeConfig: dataplane.NodeConfig{NodeName: "node-a"}})
	if err != nil {
		t.Fatal(err)
	}
	vs, ok := r.Render(st).Server(ipvs.Key{Proto: string(spn.Protocol), Addr: sp.ClusterIP, Port: uint16(sp.Port)})
	if !ok {
		t.Fatal("no ClusterIP virtual server")
	}
	var dests []string
	for _, d := range vs.Dests {
		dests = append(dests, d.Addr.String())
	}
	want := oracle.Expect(cluster.ModeIPVS, sp, st.Endpoints[spn], "node-a", "")
	if diff := cmp.Diff(want.Endpoints(), dests); diff != "" {
		t.Errorf("ipvs real servers differ from the oracle's endpoints (-oracle +dataplane):\n%s", diff)
	}
	if !slices.Equal(dests, []string{"10.244.1.2:8080", "10.244.1.3:8080"}) {
		t.Errorf("real servers %v, want the cluster's two endpoints", dests)
	}
}
