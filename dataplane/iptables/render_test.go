package iptables

import (
	"strings"
	"testing"
)

// TestSvc1Layout checks the rules of kube-proxy's test Service against the
// lines of TestOverallIPTablesRules (reference §1.4).
func TestSvc1Layout(t *testing.T) {
	st := newState()
	n := name("ns1", "svc1", "p80")
	add(st, clusterIPPort(n, "172.30.0.41", 80), ep("10.180.0.1", 80, otherNode, "R"))
	r := mustRenderer(t, testConfig())
	rs, err := r.Render(st, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O`,
		`-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ`,
		`-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ`,
		`-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ`,
		`-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80`,
		`-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000`,
		`-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN`,
		`-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000`,
		`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`,
	} {
		if !strings.Contains(rs.Restore, want+"\n") {
			t.Errorf("missing line:\n%s\nin:\n%s", want, rs.Restore)
		}
	}
}
