package cost

import (
	"testing"
)

func TestCountIPTablesShape(t *testing.T) {
	in := []ServicePortInput{
		{Endpoints: 3, Reachable: 3},
		{Endpoints: 2, Reachable: 2, Affinity: true},
		{Reject: true},
	}
	c := Count("iptables", in, true)
	// per Service: 1 KUBE-SERVICES + 1 masq + n cascade + 2n SEP (+ n affinity)
	wantNat := 6 + (1 + 1 + 3 + 6) + (1 + 1 + 2 + 4 + 2)
	if c.NatRules != wantNat || c.FilterRules != 8+1 || c.Chains != 12+4+3 {
		t.Errorf("counts %+v, want nat %d filter 9 chains 19", c, wantNat)
	}
}

func TestFirstPacketOrder(t *testing.T) {
	in := make([]ServicePortInput, 1000)
	for i := range in {
		in[i] = ServicePortInput{Endpoints: 1, Reachable: 1}
	}
	fp := IPTablesFirstPacket(in, nil)
	if fp.RulesP50 < 500 || fp.RulesP50 > 510 || fp.RulesP99 < 990 || fp.RulesP99 > 1000 {
		t.Errorf("uniform traffic over 1000 Services: %+v", fp)
	}
}
