package cost

import (
	"math"
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

func TestInterpolation(t *testing.T) {
	c, _ := Find(Defaults(), "nftables", "kube-proxy")
	o := func(n int) int { return SyntheticObjects("nftables", n, 10) }
	for _, p := range c.Points {
		if got := c.FullSync(p.Objects); math.Abs(got-p.FullSeconds)/p.FullSeconds > 1e-9 {
			t.Errorf("at a calibration point %d: %g, want %g", p.Services, got, p.FullSeconds)
		}
	}
	// Between points the power law keeps the order, and beyond the last
	// point the superlinear slope continues.
	if a, b := c.FullSync(o(2500)), c.FullSync(o(10000)); !(a > 2.7 && a < 16.8 && b > 60*2) {
		t.Errorf("interpolation 2500 -> %g, extrapolation 10000 -> %g", a, b)
	}
	ipt, _ := Find(Defaults(), "iptables", "nft")
	if g := ipt.FullSync(SyntheticObjects("iptables", 3000, 10)); g < 0.83 || g > 4.7 {
		t.Errorf("iptables 3000 -> %g", g)
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
