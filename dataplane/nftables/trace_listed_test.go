package nftables

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane/trace"
)

// The tracer reads the rules as nft lists them back (harness/diagnose
// reads dumps) with the meaning of the form this package writes.
func TestTraceListedForms(t *testing.T) {
	written := map[string][]string{
		"services":     {"ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 mark set mark or 0x4000", "ip daddr 172.30.0.41 counter jump svc"},
		"svc":          {"meta l4proto tcp dnat ip addr . port to numgen random mod 3 map { 0 : 10.180.0.1 . 80 , 1-2 : 10.180.0.2 . 80 }"},
		"masquerading": {"mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random"},
	}
	listed := map[string][]string{
		"services":     {"ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 meta mark set meta mark | 0x00004000", "ip daddr 172.30.0.41 counter packets 12 bytes 720 jump svc"},
		"svc":          {"meta l4proto tcp dnat ip to numgen random mod 3 map { 0 : 10.180.0.1 . 80 , 1-2 : 10.180.0.2 . 80 }"},
		"masquerading": {"meta mark & 0x00004000 != 0x00000000 meta mark set meta mark ^ 0x00004000 masquerade fully-random"},
	}
	traceOf := func(rules map[string][]string, src string) trace.Result {
		t.Helper()
		f := knftables.NewFake(knftables.IPv4Family, "kube-proxy")
		tx := f.NewTransaction()
		tx.Add(&knftables.Table{})
		tx.Add(&knftables.Chain{Name: "nat-prerouting", Type: knftables.PtrTo(knftables.NATType),
			Hook: knftables.PtrTo(knftables.PreroutingHook), Priority: knftables.PtrTo(knftables.DNATPriority)})
		tx.Add(&knftables.Chain{Name: "nat-postrouting", Type: knftables.PtrTo(knftables.NATType),
			Hook: knftables.PtrTo(knftables.PostroutingHook), Priority: knftables.PtrTo(knftables.SNATPriority)})
		for _, c := range []string{"services", "svc", "masquerading"} {
			tx.Add(&knftables.Chain{Name: c})
		}
		tx.Add(&knftables.Rule{Chain: "nat-prerouting", Rule: "jump services"})
		tx.Add(&knftables.Rule{Chain: "nat-postrouting", Rule: "jump masquerading"})
		for _, c := range []string{"services", "svc", "masquerading"} {
			for _, r := range rules[c] {
				if err := CheckRule(r); err != nil {
					t.Fatalf("CheckRule(%q): %v", r, err)
				}
				tx.Add(&knftables.Rule{Chain: c, Rule: r})
			}
		}
		if err := f.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
		tr, err := NewTracer(f)
		if err != nil {
			t.Fatal(err)
		}
		res, err := tr.Trace(trace.Packet{Src: netip.MustParseAddr(src), Protocol: "tcp", Dst: netip.MustParseAddr("172.30.0.41"), DPort: 80}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for _, src := range []string{"10.0.0.5", "192.168.1.5"} {
		w, l := traceOf(written, src), traceOf(listed, src)
		if diff := cmp.Diff(w, l); diff != "" {
			t.Errorf("from %s: written and listed forms differ (-written +listed):\n%s", src, diff)
		}
		masq := src == "192.168.1.5"
		if len(w) != 2 || w[0].Masquerade != masq || w[0].P > 0.34 || w[0].P < 0.33 {
			t.Errorf("from %s: %+v, want 1/3 and 2/3, masquerade %v", src, w, masq)
		}
	}
	if err := CheckRule("meta mark & 0x00004000 != 0x00000001"); err == nil {
		t.Error("a masked mark compared with a non-zero value is not a form kube-proxy writes: it should not be understood")
	}
}
