package ipvs

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

// TestFaultSkewAtMDE: rr becomes wrr with the fault's weights, and one
// rotation of the fake's wrr scheduler (the sum of the weights) gives each
// real server exactly its target share; one endpoint keeps weight 1 and rr.
func TestFaultSkewAtMDE(t *testing.T) {
	for _, k := range []int{2, 3, 10, 50} {
		var eps []*cluster.Endpoint
		for i := range k {
			eps = append(eps, ep(fmt.Sprintf("10.180.%d.%d", i/200, i%200+1), 8080, otherNode, "R"))
		}
		f := newFakes(t, testConfig(proxy.FaultSkewAtMDE))
		st, key := webState(eps...)
		f.sync(t, st, true)
		if !strings.Contains(f.ipvs.Dump(), "wrr") {
			t.Errorf("k=%d: rr was not turned into wrr:\n%s", k, f.ipvs.Dump())
		}
		w := proxy.MDESkewWeights(k)
		total := 0
		for _, x := range w {
			total += int(x)
		}
		got := counts(schedule(t, f.ipvs, key, total))
		want := proxy.MDESkewShares(k)
		for i, e := range eps {
			if share := float64(got[netipString(e)]) / float64(total); math.Abs(share-want[i]) > 1e-12 {
				t.Errorf("k=%d endpoint %d: %d of %d connections, share %v, target %v", k, i, got[netipString(e)], total, share, want[i])
			}
		}
	}
	f := newFakes(t, testConfig(proxy.FaultSkewAtMDE))
	st, key := webState(three()[:1]...)
	f.sync(t, st, true)
	if d := dests(t, f.ipvs, key); d["10.180.0.1:8080"] != 1 || len(d) != 1 {
		t.Errorf("one endpoint: real servers %v", d)
	}
}

func netipString(e *cluster.Endpoint) string { return fmt.Sprintf("%s:%d", e.IP, e.Port) }

// TestFaultsNotBuilt: the per-client affinity faults, and skew-at-mde with
// a hash scheduler, are refused at construction with an error that names
// the fault, the mode and the reason.
func TestFaultsNotBuilt(t *testing.T) {
	for _, c := range []struct {
		fault     proxy.Fault
		scheduler string
	}{
		{proxy.FaultAffinityLeak, "rr"},
		{proxy.FaultAffinityOverstay, "rr"},
		{proxy.FaultSkewAtMDE, "sh"},
		{proxy.FaultSkewAtMDE, "dh"},
		{proxy.FaultSkewAtMDE, "mh"},
	} {
		cfg := testConfig(c.fault)
		cfg.Scheduler = c.scheduler
		_, err := NewRenderer(cfg)
		if !errors.Is(err, proxy.ErrFaultNotBuilt) || !strings.HasPrefix(err.Error(), string(c.fault)+" cannot be built in ipvs mode: ") {
			t.Errorf("%s with %s: error %v", c.fault, c.scheduler, err)
		}
	}
	for _, s := range []string{"rr", "wrr", "lc", "wlc", "sed", "nq"} {
		cfg := testConfig(proxy.FaultSkewAtMDE)
		cfg.Scheduler = s
		if _, err := NewRenderer(cfg); err != nil {
			t.Errorf("skew-at-mde with %s: %v", s, err)
		}
	}
}
