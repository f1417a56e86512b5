package capacity

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/kpsim/kpsim/sim/engine"
)

// The seeded Poisson stream each programming-latency figure is computed
// over spans LatencySpan (two of kube-proxy's hourly full syncs, so that
// their share of the changes is in the p99), with at least MinLatencyEvents
// (a p99 that 20 events decide) and at most MaxLatencyEvents (a sweep stays
// fast; the span is then shorter, and Latency.SpanSeconds says so).
const (
	LatencySpan      = 2 * FullSyncPeriod
	MinLatencyEvents = 2000
	MaxLatencyEvents = 200000
)

// FullSyncPeriod is kube-proxy's proxyutil.FullSyncPeriod: the iptables and
// nftables proxiers make a sync full when the last full one is older
// (reference kube-proxy.md §1.8).
const FullSyncPeriod = time.Hour

// latencyEvents is the stream's length at a rate.
func latencyEvents(rate float64) int {
	return int(min(MaxLatencyEvents, max(MinLatencyEvents, math.Ceil(rate*LatencySpan.Seconds()))))
}

// Latency is network programming latency (kube-proxy's
// network_programming_duration_seconds: from an endpoint change to the end
// of the sync that includes it) on the worst node.
type Latency struct {
	P50 float64 `json:"p50Seconds"`
	P99 float64 `json:"p99Seconds"`
	// P99Low and P99High bound the p99: the envelope of the p99 with the
	// sync times at their estimate and at their bands' low and high ends.
	P99Low  float64 `json:"p99LowSeconds"`
	P99High float64 `json:"p99HighSeconds"`
	// EventsPerSecond is the rate of the stream; Events its length and
	// SpanSeconds its duration.
	EventsPerSecond float64 `json:"eventsPerSecond"`
	Events          int     `json:"events"`
	SpanSeconds     float64 `json:"spanSeconds"`
	// Extrapolated is set when a sync time it rests on is.
	Extrapolated bool `json:"extrapolated"`
}

// pacing is what the sync runner needs of a mode.
type pacing struct {
	minSync, maxInterval time.Duration
	// noPeriodicFull: only the start-up sync is full (the iptables
	// proxier in large-cluster mode; the ipvs proxier, whose every later
	// run reconciles what the kernel holds).
	noPeriodicFull bool
}

// programmingLatency drives kube-proxy's sync runner (engine.Syncer:
// BoundedFrequencyRunner, burst 2, one run at a time) with a Poisson stream
// of rate changes per second and returns the event-to-applied quantiles
// and the stream's span. A sync takes full seconds when it is periodic or
// when the last full sync (the start-up one at 0) is FullSyncPeriod old,
// partial seconds otherwise; with p.noPeriodicFull every sync after the
// start-up one is partial.
func programmingLatency(rate float64, n int, seed uint64, p pacing, full, partial float64) (p50, p99, span float64) {
	if rate <= 0 || n <= 0 {
		return 0, 0, 0
	}
	var lastFull int64
	s := engine.NewSyncer(engine.SyncConfig{
		MinSyncPeriod: p.minSync,
		MaxInterval:   p.maxInterval,
		Burst:         engine.DefaultBurstSyncs,
		Duration: func(si engine.SyncInfo) time.Duration {
			if !p.noPeriodicFull && (si.Changes == 0 || si.Start-lastFull >= int64(FullSyncPeriod)) {
				lastFull = si.Start
				return dur(full)
			}
			return dur(partial)
		},
	})
	r := rand.New(rand.NewPCG(seed, 0x5eed^uint64(n)))
	events := make([]int64, n)
	var syncs []engine.Sync
	t := 0.0
	for i := range events {
		t += r.ExpFloat64() / rate
		events[i] = int64(t * 1e9)
		syncs = append(syncs, s.Advance(events[i])...)
		s.Request(events[i])
	}
	last := events[n-1]
	for len(syncs) == 0 || syncs[len(syncs)-1].Start < last {
		next, ok := s.Next()
		if !ok {
			break
		}
		syncs = append(syncs, s.Advance(next)...)
	}
	lat := make([]float64, n)
	for i, at := range events {
		k := sort.Search(len(syncs), func(k int) bool { return syncs[k].Start >= at })
		if k == len(syncs) {
			lat[i] = math.Inf(1)
			continue
		}
		lat[i] = float64(syncs[k].End-at) / 1e9
	}
	slices.Sort(lat)
	return quantile(lat, 0.5), quantile(lat, 0.99), float64(last) / 1e9
}

func dur(s float64) time.Duration {
	if !(s > 0) || math.IsInf(s, 0) {
		return 0
	}
	return time.Duration(math.Min(s, 1e9) * 1e9)
}

// quantile of sorted values (nearest rank).
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(v)))) - 1
	return v[max(0, min(i, len(v)-1))]
}
