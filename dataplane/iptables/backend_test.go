package iptables

import (
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
