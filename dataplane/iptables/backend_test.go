package iptables

import (
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
