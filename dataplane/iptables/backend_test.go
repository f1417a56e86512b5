package iptables

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestMergeJumps(t *testing.T) {
	restore := "*filter\n:KUBE-SERVICES - [0:0]\nCOMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\nCOMMIT\n"
	jumps := "*filter\n-A FORWARD -j KUBE-SERVICES\nCOMMIT\n*nat\n-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\nCOMMIT\n"
	got := MergeJumps(restore, jumps)
	want := "*filter\n:KUBE-SERVICES - [0:0]\n-A FORWARD -j KUBE-SERVICES\nCOMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\n-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\nCOMMIT\n"
	if got != want {
		t.Errorf("merged:\n%s\nwant:\n%s", got, want)
	}
	// The merged text is valid for the fake, and equals two restores.
	f1, f2 := NewFake(), NewFake()
	full := "*filter\n:KUBE-SERVICES - [0:0]\nCOMMIT\n*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n"
	if err := f1.Restore(MergeJumps(full, jumps)); err != nil {
		t.Fatal(err)
	}
	if err := f2.Restore(full); err != nil {
		t.Fatal(err)
	}
	if err := f2.Restore(jumps); err != nil {
		t.Fatal(err)
	}
	if f1.Dump() != f2.Dump() || !strings.Contains(f1.Dump(), "PREROUTING") {
		t.Errorf("merged restore differs from two restores:\n%s\n---\n%s", f1.Dump(), f2.Dump())
	}
}

// TestMergeJumpsCanary: the canary declarations go after each table's
// header, and a table the restore text lacks (mangle) gets its own section;
// MissingJumps keeps the declarations even when every rule is there.
func TestMergeJumpsCanary(t *testing.T) {
	restore := "*filter\n:KUBE-SERVICES - [0:0]\nCOMMIT\n*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n"
	jumps := "*filter\n:KUBE-PROXY-CANARY - [0:0]\n-A FORWARD -j KUBE-SERVICES\nCOMMIT\n*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n*nat\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n"
	want := "*filter\n:KUBE-PROXY-CANARY - [0:0]\n:KUBE-SERVICES - [0:0]\n-A FORWARD -j KUBE-SERVICES\nCOMMIT\n" +
		"*nat\n:KUBE-PROXY-CANARY - [0:0]\n:KUBE-SERVICES - [0:0]\nCOMMIT\n" +
		"*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n"
	if got := MergeJumps(restore, jumps); got != want {
		t.Errorf("merged:\n%s\nwant:\n%s", got, want)
	}
	f := NewFake()
	if err := f.Restore(MergeJumps(restore, jumps)); err != nil {
		t.Fatal(err)
	}
	for _, table := range CanaryTables {
		if !strings.Contains(f.Dump(), "*"+table+"\n") || !slices.Contains(f.ChainNames(table), ChainCanary) {
			t.Errorf("%s: no %s after the merged restore", table, ChainCanary)
		}
	}
	missing := MissingJumps(jumps, f.Dump())
	if strings.Contains(missing, "-A ") || strings.Count(missing, ":"+ChainCanary) != 3 {
		t.Errorf("MissingJumps after the restore:\n%s", missing)
	}
}

// TestNFAcct: the Backend creates kube-proxy's two nfacct counters and the
// INVALID drop and localhost node-port rules count into them; on a kernel
// without nfacct the rules go without the match and the sync succeeds; the
// fake, as the kernel, refuses a rule naming a missing counter.
func TestNFAcct(t *testing.T) {
	invalid := "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP"
	localhost := "-A KUBE-NODEPORTS -m comment --comment ns9/svc9 -m tcp -p tcp -d 127.0.0.0/8 --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-"
	for _, supported := range []bool{true, false} {
		b, c := newBackend(t, testConfig())
		c.NoNFAcct = !supported
		rs := apply(t, b, overallState(), nil, true)
		if got := c.Fake.NFAcct[NFAcctInvalidDropped] && c.Fake.NFAcct[NFAcctLocalhostNodePorts]; got != supported {
			t.Errorf("nfacct supported %v: counters %v", supported, c.Fake.NFAcct)
		}
		for _, want := range []string{invalid, localhost} {
			if strings.Contains(rs.Restore, want) != supported {
				t.Errorf("nfacct supported %v: %q in the rules is %v", supported, want, !supported)
			}
		}
		if !supported && !strings.Contains(rs.Restore, "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n") {
			t.Errorf("without nfacct, no plain INVALID drop rule:\n%s", rs.Restore)
		}
	}
	f := NewFake()
	err := f.Restore("*filter\n:KUBE-C - [0:0]\n-A KUBE-C -m nfacct --nfacct-name nope -j DROP\nCOMMIT\n")
	if !errors.Is(err, ErrBadRule) {
		t.Errorf("rule with a missing nfacct counter: %v, want ErrBadRule", err)
	}
}
