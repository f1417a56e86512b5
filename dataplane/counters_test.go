package dataplane

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/sim/cluster"
)

// TestSortCounters: by service port, then endpoints by address and port
// (10.0.0.9 before 10.0.0.10), then the verdicts.
func TestSortCounters(t *testing.T) {
	a := cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "a"}, Port: "p"}
	b := cluster.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "b"}, Port: "p"}
	cs := []Counter{
		{ServicePort: b, Endpoint: "10.0.0.1:80"},
		{ServicePort: a, Endpoint: "REJECT"},
		{ServicePort: a, Endpoint: "10.0.0.10:80"},
		{ServicePort: a, Endpoint: "10.0.0.9:80"},
	}
	SortCounters(cs)
	var got []string
	for _, c := range cs {
		got = append(got, c.ServicePort.Name+" "+c.Endpoint)
	}
	want := []string{"a 10.0.0.9:80", "a 10.0.0.10:80", "a REJECT", "b 10.0.0.1:80"}
	if !slices.Equal(got, want) {
		t.Errorf("sorted %q, want %q", got, want)
	}
}
