package report

import (
	"strings"
	"testing"

	"github.com/kpsim/kpsim/sim/cost"
)

// A modelled sync time never reads as a measurement: outside the measured
// range it carries the extrapolation mark, inside its band, and a default
// nothing here measured says so.
func TestSyncCellMarks(t *testing.T) {
	out := &cost.Estimate{Seconds: 41, Low: 28, High: 60, Extrapolated: true, Factor: 6}
	in := &cost.Estimate{Seconds: 2, Low: 1.5, High: 2.6}
	for _, c := range []struct {
		e     *cost.Estimate
		basis string
		want  string
	}{
		{out, "iptables/nft: sim calibrate", "41.00 s (model, extrapolated, 6.0x the largest measured size; 28.00 s-60.00 s)"},
		{in, "nftables/kube-proxy: sim calibrate", "2.00 s (model, 1.50 s-2.60 s)"},
		{in, "ipvs/netlink: estimate, not measured: ...", "2.00 s (estimate, not measured, 1.50 s-2.60 s)"},
		{nil, "fixed by the caller (test)", "2.00 s"},
	} {
		if got := syncCell(2, c.e, c.basis); c.e != out && got != c.want {
			t.Errorf("syncCell(%+v, %q) = %q, want %q", c.e, c.basis, got, c.want)
		} else if c.e == out && syncCell(41, out, c.basis) != c.want {
			t.Errorf("syncCell(%+v) = %q, want %q", out, syncCell(41, out, c.basis), c.want)
		}
	}
	if s := (Sync{FullEstimate: out}); !s.Extrapolated() || !strings.Contains(syncCell(41, out, ""), "extrapolated") {
		t.Error("an extrapolated full sync is not marked")
	}
}
