package iptables

import (
	"errors"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/dataplane/trace"
)

func TestFakeRestoreSemantics(t *testing.T) {
	f := NewFake(nodeIP)
	must := func(text string) {
		t.Helper()
		if err := f.Restore(text); err != nil {
			t.Fatal(err)
		}
	}
	must("*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-A KUBE-A -j KUBE-B\n-A KUBE-B -j RETURN\n-A PREROUTING -j KUBE-A\nCOMMIT\n")
	// --noflush: declaring KUBE-B flushes it; KUBE-A is kept; built-in
	// PREROUTING is not flushed by its declaration.
	must("*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-B - [0:0]\n-A KUBE-B -j ACCEPT\nCOMMIT\n")
	want := `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-A - [0:0]
:KUBE-B - [0:0]
-A PREROUTING -j KUBE-A
-A KUBE-A -j KUBE-B
-A KUBE-B -j ACCEPT
COMMIT
`
	if d := lineDiff(want, f.Dump()); d != "" {
		t.Errorf("dump (-want +got):\n%s", d)
	}
	before := f.Dump()
	for _, c := range []struct {
		name, text string
		err        error
	}{
		{"jump to undefined chain", "*nat\n:KUBE-C - [0:0]\n-A KUBE-C -j KUBE-NOPE\nCOMMIT\n", ErrNoChain},
		{"append to undefined chain", "*nat\n-A KUBE-NOPE -j ACCEPT\nCOMMIT\n", ErrNoChain},
		{"delete referenced chain", "*nat\n:KUBE-B - [0:0]\n-X KUBE-B\nCOMMIT\n", ErrChainInUse},
		{"delete non-empty chain", "*nat\n-X KUBE-A\nCOMMIT\n", ErrChainNotEmpt},
		{"delete built-in chain", "*nat\n-X PREROUTING\nCOMMIT\n", ErrBadInput},
		{"delete missing chain", "*nat\n-X KUBE-Z\nCOMMIT\n", ErrNoChain},
		{"no commit", "*nat\n:KUBE-C - [0:0]\n", ErrBadInput},
		{"unknown table", "*mangle2\nCOMMIT\n", ErrBadInput},
		{"long chain name", "*nat\n:KUBE-SVC-0123456789ABCDEFGHIJ - [0:0]\nCOMMIT\n", ErrBadInput},
		{"unknown option", "*nat\n:KUBE-C - [0:0]\n-A KUBE-C --frobnicate -j ACCEPT\nCOMMIT\n", ErrBadRule},
		{"DNAT in filter", "*filter\n:KUBE-C - [0:0]\n-A KUBE-C -p tcp -j DNAT --to-destination 1.2.3.4:80\nCOMMIT\n", ErrBadRule},
		{"REJECT in nat", "*nat\n:KUBE-C - [0:0]\n-A KUBE-C -j REJECT\nCOMMIT\n", ErrBadRule},
		{"missing set", "*nat\n:KUBE-C - [0:0]\n-A KUBE-C -m set --match-set KUBE-AFF-X src -j ACCEPT\nCOMMIT\n", ErrNoSet},
		{"reap without seconds", "*nat\n:KUBE-C - [0:0]\n-A KUBE-C -m recent --name X --rcheck --reap -j ACCEPT\nCOMMIT\n", ErrBadRule},
		{"unterminated quote", "*nat\n:KUBE-C - [0:0]\n-A KUBE-C -m comment --comment \"open -j ACCEPT\nCOMMIT\n", ErrBadRule},
		{"bad probability", "*nat\n:KUBE-C - [0:0]\n-A KUBE-C -m statistic --mode random --probability 2 -j ACCEPT\nCOMMIT\n", ErrBadRule},
		// A failure in the second table undoes the first.
		{"all or nothing", "*filter\n:KUBE-F - [0:0]\nCOMMIT\n*nat\n-A KUBE-NOPE -j ACCEPT\nCOMMIT\n", ErrNoChain},
	} {
		err := f.Restore(c.text)
		if !errors.Is(err, c.err) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.err)
		}
		if f.Dump() != before {
			t.Errorf("%s: a failed restore changed the tables", c.name)
		}
	}
	// Delete in order: flush KUBE-A's reference, then KUBE-B can go.
	must("*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-X KUBE-B\nCOMMIT\n")
	if strings.Contains(f.Dump(), "KUBE-B") {
		t.Error("KUBE-B not deleted")
	}
	must("*nat\n-D PREROUTING -j KUBE-A\n-I POSTROUTING 1 -j ACCEPT\nCOMMIT\n")
	if strings.Contains(f.Dump(), "-A PREROUTING") || !strings.Contains(f.Dump(), "-A POSTROUTING -j ACCEPT") {
		t.Errorf("-D/-I not applied:\n%s", f.Dump())
	}
}

func TestFakeIPSets(t *testing.T) {
	f := NewFake()
	if err := f.RestoreIPSet("create KUBE-AFF-A hash:ip family inet timeout 60\n"); err != nil {
		t.Fatal(err)
	}
	// -exist: the same set again is fine, a different one is not.
	if err := f.RestoreIPSet("create KUBE-AFF-A hash:ip family inet timeout 60\n"); err != nil {
		t.Error(err)
	}
	if err := f.RestoreIPSet("create KUBE-AFF-A hash:ip family inet timeout 61\n"); !errors.Is(err, ErrSetExists) {
		t.Errorf("changed set: %v", err)
	}
	if err := f.Restore("*nat\n:KUBE-C - [0:0]\n-A KUBE-C -j SET --add-set KUBE-AFF-A src --exist --timeout 60\nCOMMIT\n"); err != nil {
		t.Fatal(err)
	}
	if err := f.RestoreIPSet("destroy KUBE-AFF-A\n"); !errors.Is(err, ErrChainInUse) {
		t.Errorf("destroy of a set in use: %v", err)
	}
	if err := f.RestoreIPSet("destroy KUBE-AFF-B\n"); !errors.Is(err, ErrNoSet) {
		t.Errorf("destroy of a missing set: %v", err)
	}
	if got := f.DumpIPSets(); got != "create KUBE-AFF-A hash:ip family inet timeout 60\n" {
		t.Errorf("sets: %q", got)
	}
}

// TestTraceGoto and policies: -g returns to the caller's caller, a DROP
// policy drops what falls off a built-in chain.
func TestTraceGotoAndPolicy(t *testing.T) {
	f := NewFake(nodeIP)
	err := f.Restore(`*nat
:KUBE-A - [0:0]
:KUBE-B - [0:0]
-A PREROUTING -j KUBE-A
-A PREROUTING -p tcp -j DNAT --to-destination 10.9.9.9:1
-A KUBE-A -g KUBE-B
-A KUBE-A -p tcp -j DNAT --to-destination 10.8.8.8:1
-A KUBE-B -m statistic --mode random --probability 0.25 -j RETURN
-A KUBE-B -p tcp -j DNAT --to-destination 10.7.7.7:1
COMMIT
*filter
:FORWARD DROP [0:0]
-A FORWARD -d 10.7.7.7 -j ACCEPT
COMMIT
`)
	if err != nil {
		t.Fatal(err)
	}
	res := tracePacket(t, f, podIP, "172.30.0.1", 80, nil)
	if res.P("10.7.7.7:1") != 0.75 || res.P(trace.OutcomeDrop) != 0.25 {
		t.Errorf("got:\n%s", res.Lines())
	}
}
