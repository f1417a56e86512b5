package capacity

import (
	"math"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
	"github.com/kpsim/kpsim/sim/scenario"
)

func TestParseSLO(t *testing.T) {
	for _, c := range []struct {
		in     string
		metric string
		limit  float64
	}{
		{"programming-latency=1s", SLOProgrammingLatency, 1},
		{"full-sync=500ms", SLOFullSync, 0.5},
		{"first-packet-rules=300", SLOFirstPacketRules, 300},
	} {
		s, err := ParseSLO(c.in)
		if err != nil || s.Metric != c.metric || s.Limit != c.limit {
			t.Errorf("ParseSLO(%q) = %+v, %v", c.in, s, err)
		}
	}
	for _, bad := range []string{"", "programming-latency", "programming-latency=", "programming-latency=fast", "full-sync=-1s", "full-sync=0s", "first-packet-rules=1.5", "first-packet-rules=0", "p99=1s"} {
		if _, err := ParseSLO(bad); err == nil {
			t.Errorf("ParseSLO(%q) accepted", bad)
		}
	}
}

func TestParseSizes(t *testing.T) {
	got, err := ParseSizes("5000, 1000,2000,1000")
	if err != nil || len(got) != 3 || got[0] != 1000 || got[2] != 5000 {
		t.Errorf("ParseSizes = %v, %v", got, err)
	}
	for _, bad := range []string{"", "1000,", "0", "-5", "1e3", "x", "1000000"} {
		if _, err := ParseSizes(bad); err == nil {
			t.Errorf("ParseSizes(%q) accepted", bad)
		}
	}
}

// synthetic is a sweep whose one variant's full sync is the given seconds
// per size, extrapolated where ex says.
func synthetic(sizes []int, full []float64, ex []bool) *Result {
	res := &Result{Models: []Model{{Variant: Variant{cluster.ModeIPTables, "nft"}}}}
	for i, n := range sizes {
		res.Sizes = append(res.Sizes, Size{Services: n, Rows: []Row{{Variant: res.Models[0].Variant,
			FullSync: cost.Estimate{Seconds: full[i], Low: full[i], High: full[i], Extrapolated: ex[i]}}}})
	}
	return res
}

// TestAnswerIsLargestPassing: the answer is the largest size that meets
// the SLO, flagged when it or the first size that fails after it is
// extrapolated.
func TestAnswerIsLargestPassing(t *testing.T) {
	slo := SLO{Metric: SLOFullSync, Limit: 10, Text: "full-sync=10s"}
	sizes := []int{1000, 2000, 5000, 10000}
	for _, c := range []struct {
		name    string
		full    []float64
		ex      []bool
		largest int
		extrap  bool
		allMeet bool
	}{
		{"middle", []float64{1, 5, 20, 80}, []bool{false, false, false, false}, 2000, false, false},
		{"next fails extrapolated", []float64{1, 5, 20, 80}, []bool{false, false, true, true}, 2000, true, false},
		{"at the limit passes", []float64{1, 10, 10.01, 80}, []bool{false, false, false, false}, 2000, false, false},
		{"none", []float64{11, 20, 30, 40}, []bool{false, false, false, false}, 0, false, false},
		{"all", []float64{1, 2, 3, 4}, []bool{false, false, false, true}, 10000, true, true},
		// Not monotone (a model's band can do this): still the largest.
		{"not monotone", []float64{1, 12, 5, 40}, []bool{false, false, false, false}, 5000, false, false},
	} {
		a := answer(synthetic(sizes, c.full, c.ex), []SLO{slo})
		if len(a) != 1 {
			t.Fatalf("%s: %d answers", c.name, len(a))
		}
		if a[0].Largest != c.largest || a[0].Extrapolated != c.extrap || a[0].AllMeet != c.allMeet {
			t.Errorf("%s: %+v, want largest %d extrapolated %t allMeet %t", c.name, a[0], c.largest, c.extrap, c.allMeet)
		}
	}
}

// TestLatencyIdleIsSyncTime: with events far apart every change finds a
// token and an idle runner, so its latency is exactly the partial sync.
func TestLatencyIdleIsSyncTime(t *testing.T) {
	p50, p99, _ := programmingLatency(0.001, 200, 1, pacing{minSync: time.Second, maxInterval: time.Hour}, 0.25, 0.25)
	if p50 != 0.25 || p99 != 0.25 {
		t.Errorf("p50 %g p99 %g, want 0.25", p50, p99)
	}
}

// TestLatencyPacing: under a rate far above 1/minSyncPeriod with instant
// syncs, the runner serves a change at most minSyncPeriod after it
// arrives (burst 2 spent, one token per period), and most changes wait.
func TestLatencyPacing(t *testing.T) {
	p50, p99, _ := programmingLatency(100, 5000, 1, pacing{minSync: time.Second, maxInterval: time.Hour}, 0, 0)
	if p99 > 1+1e-9 || p99 < 0.9 {
		t.Errorf("p99 %g, want just under 1 s", p99)
	}
	// Arrivals are uniform within a period: the median wait is about half.
	if math.Abs(p50-0.5) > 0.05 {
		t.Errorf("p50 %g, want about 0.5 s", p50)
	}
}

// TestLatencyBacklog: syncs slower than the events queue them; one at a
// time, each change waits for the running sync and then its own.
func TestLatencyBacklog(t *testing.T) {
	_, p99, _ := programmingLatency(10, 2000, 1, pacing{minSync: time.Second, maxInterval: time.Hour}, 3, 3)
	if p99 < 3 || p99 > 6+1e-9 {
		t.Errorf("p99 %g, want between one and two sync times (3-6 s)", p99)
	}
}

// TestLatencyHourlyFullSync: one sync an hour is full (kube-proxy's
// FullSyncPeriod); a 100 s full sync holds back the changes that arrive
// while it runs, about 100/3600 of them, which is more than 1 %: the p99
// waits for it while the median does not.
func TestLatencyHourlyFullSync(t *testing.T) {
	p50, p99, span := programmingLatency(1, 3*3600, 1, pacing{minSync: time.Second, maxInterval: time.Hour}, 100, 0.01)
	if span < 2.5*3600 {
		t.Fatalf("the stream spans %g s, want about 3 h", span)
	}
	if p50 > 1.1 || p99 < 10 {
		t.Errorf("p50 %g (want at most minSyncPeriod plus a partial sync), p99 %g (want the full sync's wait, over 10 s)", p50, p99)
	}
	_, p99Partial, _ := programmingLatency(1, 3*3600, 1, pacing{minSync: time.Second, maxInterval: time.Hour}, 0.01, 0.01)
	if p99Partial > 1.1 {
		t.Errorf("with the full sync as fast as a partial one, p99 %g, want at most about 1 s", p99Partial)
	}
}

// TestLatencyLargeClusterNoPeriodicFull: the iptables proxier in
// large-cluster mode makes no periodic full sync, so a full sync of a day
// (iptables-nft's --noflush cost at 30,000 Services) leaves the stream's
// latency to the partial syncs; the nftables proxier's hourly full sync does
// not.
func TestLatencyLargeClusterNoPeriodicFull(t *testing.T) {
	p := pacingOf(cluster.ModeIPTables, scenario.Proxy{MinSyncPeriod: &metav1.Duration{Duration: time.Second}}, cluster.LargeClusterEndpoints+1)
	if !p.noPeriodicFull {
		t.Fatalf("iptables mode with %d endpoints: periodic full syncs, want none (large-cluster mode)", cluster.LargeClusterEndpoints+1)
	}
	_, p99, _ := programmingLatency(1, 3*3600, 1, p, 86400, 0.01)
	if p99 > 1.1 {
		t.Errorf("large-cluster iptables: p99 %g s, want about minSyncPeriod plus a partial sync", p99)
	}
	for _, c := range []struct {
		mode      cluster.Mode
		endpoints int
	}{{cluster.ModeIPTables, cluster.LargeClusterEndpoints}, {cluster.ModeNFTables, 10 * cluster.LargeClusterEndpoints}} {
		p := pacingOf(c.mode, scenario.Proxy{MinSyncPeriod: &metav1.Duration{Duration: time.Second}}, c.endpoints)
		if p.noPeriodicFull {
			t.Errorf("%s mode, %d endpoints: no periodic full sync, want one an hour", c.mode, c.endpoints)
		}
		if _, p99, _ := programmingLatency(1, 3*3600, 1, p, 100, 0.01); p99 < 10 {
			t.Errorf("%s mode, %d endpoints: p99 %g s, want the hourly full sync's wait (over 10 s)", c.mode, c.endpoints, p99)
		}
	}
}
