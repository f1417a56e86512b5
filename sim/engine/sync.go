package engine

// Syncer paces one node's syncs the way kube-proxy's sync runner does
// (pkg/util/async/bounded_frequency_runner.go, as every mode's proxier
// builds it: minInterval = --*-min-sync-period, burstSyncs = 2, maxInterval
// one hour for iptables and nftables, --ipvs-sync-period for ipvs):
//
//   - every EndpointSlice or Service change calls Run(); requests coalesce;
//   - a run happens when the token bucket (rate 1/minInterval, burst 2,
//     starting full) has a token; otherwise a timer is set for
//     minInterval after the end of the previous run;
//   - runs never overlap: a request during a run is served when it ends;
//   - after a run the periodic timer is set to maxInterval.
//
// A change's rules take effect at the end of the first sync that starts at
// or after it (the sync reads the state when it starts and applies it when
// it ends; the sync's duration comes from the cost model).
//
// The discrete-event simulator drives a Syncer: call Request at each change
// the node sees, then Advance to collect the syncs that have started by
// then; wake up at Next to call Advance again. Calls must come in
// non-decreasing time order.

import (
	"math"
	"time"
)

// DefaultBurstSyncs is kube-proxy's burstSyncs.
const DefaultBurstSyncs = 2

// SyncConfig describes a mode's sync pacing and cost.
type SyncConfig struct {
	// MinSyncPeriod is the runner's minInterval; 0 disables rate limiting.
	MinSyncPeriod time.Duration
	// MaxInterval is the periodic run (0: none).
	MaxInterval time.Duration
	// Burst is burstSyncs; 0 means DefaultBurstSyncs.
	Burst int
	// Duration is the cost model's sync time; nil means syncs are instant.
	Duration func(SyncInfo) time.Duration
}

// SyncInfo describes a sync as it starts, for the cost model.
type SyncInfo struct {
	Start int64
	// Changes is the number of requests the sync serves (0 for a periodic
	// run).
	Changes int
}

// Sync is one run of the sync loop: rules reflecting the cluster state at
// Start are in place from End.
type Sync struct {
	Start, End int64
	Changes    int
}

// Syncer is one node's sync runner.
type Syncer struct {
	cfg     SyncConfig
	period  int64 // minInterval, ns
	tokens  int64 // token bucket content in ns of period (one token = period)
	tokAt   int64
	lastEnd int64
	running bool
	busyTo  int64
	pending int
	timerAt int64 // -1: no timer
	out     []Sync
}

// NewSyncer returns a runner that has not run yet.
func NewSyncer(cfg SyncConfig) *Syncer {
	if cfg.Burst <= 0 {
		cfg.Burst = DefaultBurstSyncs
	}
	p := int64(cfg.MinSyncPeriod)
	return &Syncer{cfg: cfg, period: p, tokens: int64(cfg.Burst) * p, lastEnd: math.MinInt64 / 2, timerAt: -1}
}

// Request records a change seen by the node at now (proxier.Sync → Run).
func (s *Syncer) Request(now int64) {
	s.run(now)
	s.pending++
	if !s.running {
		s.tryRun(now)
	}
}

// Advance processes the runner up to now and returns the syncs that started
// since the previous call.
func (s *Syncer) Advance(now int64) []Sync {
	s.run(now)
	out := s.out
	s.out = nil
	return out
}

// Next is the time of the runner's next own event (a sync ending or a timer
// firing); false when there is none.
func (s *Syncer) Next() (int64, bool) {
	if s.running {
		return s.busyTo, true
	}
	if s.timerAt >= 0 {
		return s.timerAt, true
	}
	return 0, false
}

// run processes the runner's own events up to and including now.
func (s *Syncer) run(now int64) {
	for {
		switch {
		case s.running && s.busyTo <= now:
			s.running = false
			s.lastEnd = s.busyTo
			s.timerAt = -1
			if s.cfg.MaxInterval > 0 {
				s.timerAt = s.lastEnd + int64(s.cfg.MaxInterval)
			}
			if s.pending > 0 {
				s.tryRun(s.lastEnd)
			}
		case !s.running && s.timerAt >= 0 && s.timerAt <= now:
			t := s.timerAt
			s.timerAt = -1
			s.tryRun(t)
		default:
			return
		}
	}
}

// tryRun is BoundedFrequencyRunner.tryRun at time t.
func (s *Syncer) tryRun(t int64) {
	if s.period > 0 {
		s.tokens += t - s.tokAt
		if full := int64(s.cfg.Burst) * s.period; s.tokens > full {
			s.tokens = full
		}
		s.tokAt = t
		if s.tokens < s.period {
			next := s.lastEnd + s.period
			if tok := t + s.period - s.tokens; next < tok {
				next = tok
			}
			if s.timerAt < 0 || next < s.timerAt {
				s.timerAt = next
			}
			return
		}
		s.tokens -= s.period
	}
	var d time.Duration
	if s.cfg.Duration != nil {
		d = s.cfg.Duration(SyncInfo{Start: t, Changes: s.pending})
	}
	s.out = append(s.out, Sync{Start: t, End: t + int64(d), Changes: s.pending})
	s.pending = 0
	s.running = true
	s.busyTo = t + int64(d)
	s.timerAt = -1
}
