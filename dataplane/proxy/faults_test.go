package proxy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/sim/cluster"
)

func TestParseFaults(t *testing.T) {
	fs, err := ParseFaults([]string{"uniform-probability", "", " drop-last-endpoint "})
	if err != nil {
		t.Fatal(err)
	}
	if !fs.Has(FaultUniformProbability) || !fs.Has(FaultDropLastEndpoint) || fs.Has(FaultKeepNotReady) {
		t.Errorf("set %v", fs)
	}
	if fs.String() != "drop-last-endpoint,uniform-probability" {
		t.Errorf("String() = %q", fs.String())
	}
	if none, _ := ParseFaults(nil); none != nil || none.String() != "none" || none.Has(FaultKeepNotReady) {
		t.Error("empty set is not nil/none")
	}
	_, err = ParseFaults([]string{"wrong-probability"})
	if !errors.Is(err, ErrUnknownFault) {
		t.Fatalf("error %v", err)
	}
	for _, n := range FaultNames() {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("error %q does not list %s", err, n)
		}
	}
	if len(AllFaults()) != 16 {
		t.Errorf("%d faults", len(AllFaults()))
	}
	for _, f := range AllFaults() {
		if f.Doc() == "" {
			t.Errorf("fault %s has no doc", f)
		}
	}
}

func TestEndpointMemory(t *testing.T) {
	m := NewEndpointMemory()
	n := cluster.ServicePortName{Port: "p"}
	a := &cluster.Endpoint{IP: netip.MustParseAddr("10.0.0.2"), Port: 80, Ready: true}
	b := &cluster.Endpoint{IP: netip.MustParseAddr("10.0.0.1"), Port: 80, Ready: true}
	if got := m.Merge(n, []*cluster.Endpoint{a, b}); len(got) != 2 {
		t.Fatal(got)
	}
	got := m.Merge(n, []*cluster.Endpoint{a})
	if len(got) != 2 || got[0] != b || got[1] != a {
		t.Errorf("forgotten endpoint not kept in order: %v", got)
	}
	if got := m.Merge(n, nil); len(got) != 2 {
		t.Errorf("all endpoints gone: %v", got)
	}
}
