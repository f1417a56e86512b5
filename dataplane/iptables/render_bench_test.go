package iptables

import "testing"

// BenchmarkRenderFullCold5000x10 renders with a new renderer each time: the
// first sync of a Backend, which has no previous render to reuse.
func BenchmarkRenderFullCold5000x10(b *testing.B) {
	st := bigState(5000, 10)
	b.ReportAllocs()
	for b.Loop() {
		r, _ := NewRenderer(testConfig())
		if _, err := r.Render(st, nil, true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMergeJumps5000x10 is the first sync's merge of the jump rules
// into the restore text.
func BenchmarkMergeJumps5000x10(b *testing.B) {
	r, _ := NewRenderer(testConfig())
	rs, err := r.Render(bigState(5000, 10), nil, true)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		MergeJumps(rs.Restore, rs.Jumps)
	}
}
