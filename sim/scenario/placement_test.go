package scenario

import (
	"fmt"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// placementCounts expands a generated scenario and counts each Service's
// endpoints per node.
func placementCounts(t *testing.T, gen string) []map[string]int {
	t.Helper()
	doc := fmt.Sprintf(`apiVersion: kpsim.dev/v1alpha1
kind: Scenario
metadata: {name: placement}
seed: 7
cluster: {nodeCount: 6, nodeCIDRMaskSize: 20}
generate:
  services: 40
  endpointsPerService: {kind: fixed, value: 60}
%s`, gen)
	l, err := Load("placement.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]map[string]int{}
	_, err = ExpandTo(l, nil, func(o runtime.Object) error {
		sl, ok := o.(*discoveryv1.EndpointSlice)
		if !ok {
			return nil
		}
		svc := sl.Labels[discoveryv1.LabelServiceName]
		if per[svc] == nil {
			per[svc] = map[string]int{}
		}
		for _, ep := range sl.Endpoints {
			per[svc][*ep.NodeName]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]int
	for _, m := range per {
		out = append(out, m)
	}
	return out
}

// Weighted placement splits each Service's endpoints exactly as the
// weights do when the count is a multiple of their sum.
func TestWeightedPlacement(t *testing.T) {
	for _, m := range placementCounts(t, "  placement: weighted\n  nodeWeights: {node-1: 1, node-2: 2, node-3: 3}\n") {
		if m["node-1"] != 10 || m["node-2"] != 20 || m["node-3"] != 30 || len(m) != 3 {
			t.Fatalf("weighted 1:2:3 placement of 60 endpoints: %v", m)
		}
	}
}

// Skewed placement gives each Service a hot node: with exponent 2 over 6
// nodes the first in the Service's order has 1/1.49 ≈ 67 % of the weight,
// so its busiest node holds well over the 1/6 spread gives.
func TestSkewedPlacement(t *testing.T) {
	hot := 0
	for _, m := range placementCounts(t, "  placement: skewed\n  placementSkew: 2\n") {
		busiest := 0
		for _, n := range m {
			busiest = max(busiest, n)
		}
		if busiest >= 30 {
			hot++
		}
	}
	if hot < 38 {
		t.Fatalf("only %d of 40 Services have a node with half their endpoints under skewed placement (exponent 2)", hot)
	}
	for _, m := range placementCounts(t, "  placement: spread\n") {
		for n, c := range m {
			if c != 10 {
				t.Fatalf("spread placement put %d of 60 endpoints on %s: %v", c, n, m)
			}
		}
	}
}
