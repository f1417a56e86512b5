package dataplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kpsim/kpsim/sim/cluster"
)

// SyncConfig paces a Syncer as kube-proxy's BoundedFrequencyRunner does.
type SyncConfig struct {
	// MinSyncPeriod is the least time between two syncs (changes arriving
	// sooner wait and are coalesced).
	MinSyncPeriod time.Duration
	// SyncPeriod forces a full sync at least this often.
	SyncPeriod time.Duration
	// RetryPeriod is the wait after a failed sync (kube-proxy waits
	// SyncPeriod; a test harness may want less). Zero means SyncPeriod.
	RetryPeriod time.Duration
}

// Syncer drives one Backend from one Tracker: it drains the tracker's
// changes, calls Backend.Sync (full at start, after a failure and every
// SyncPeriod; partial otherwise) and records kube-proxy's metrics.
type Syncer struct {
	cfg     SyncConfig
	backend Backend
	tracker *cluster.Tracker
	metrics *Metrics
	now     func() time.Time

	mu       sync.Mutex
	lastErr  error
	syncs    int
	failures int
	synced   chan struct{} // closed and replaced after each successful sync
	pending  []cluster.ServicePortName
	triggers []time.Time // change times not yet programmed
	needFull bool
	lastFull time.Time
	lastSync time.Time
	// applied is the tracker Seq the last successful sync had drained, and
	// appliedAt when that sync finished.
	applied   uint64
	appliedAt time.Time
	// health follows the syncs (SetHealth); nil: none.
	health *HealthServer
	// healthErr is the health server's last error (a port it could not
	// open), reported beside the sync's.
	healthErr error
	// conntrack cleans stale conntrack entries after a sync
	// (SetConntrack); nil: none. conntrackErr is its last error.
	conntrack    ConntrackCleaner
	conntrackErr error
}

// ConntrackCleaner removes a node's stale conntrack entries after a
// successful sync (conntrack.Cleaner: kube-proxy's CleanStaleEntries).
// Required says whether the changes that sync drained call for it (an
// endpoint of a UDP Service changed); Clean cleans for the state the sync
// programmed and returns the entries deleted.
type ConntrackCleaner interface {
	Required(ch cluster.Changes, st *cluster.State) bool
	Clean(st *cluster.State) (int, error)
}

// SetConntrack makes the syncer clean conntrack after each successful
// sync, as kube-proxy's proxiers do at the end of syncProxyRules. Call it
// before Run.
func (s *Syncer) SetConntrack(c ConntrackCleaner) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conntrack = c
}

// ConntrackError is the cleanup's error after the last successful sync
// (nil: it ran or had nothing to do). kube-proxy logs it and goes on.
func (s *Syncer) ConntrackError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conntrackErr
}

// SetHealth makes the syncer drive kube-proxy's health servers as
// kube-proxy's proxier does: a queued change is reported as it arrives,
// a successful sync marks the proxy updated and then brings the health
// check node ports up to date. Call it before Run.
func (s *Syncer) SetHealth(h *HealthServer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.health = h
}

// HealthError is the health server's error of the last successful sync
// (nil: every health check node port is served).
func (s *Syncer) HealthError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.healthErr
}

// NewSyncer builds a syncer; metrics may be nil (a private set is made).
func NewSyncer(cfg SyncConfig, b Backend, t *cluster.Tracker, m *Metrics) *Syncer {
	if cfg.RetryPeriod == 0 {
		cfg.RetryPeriod = cfg.SyncPeriod
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Syncer{cfg: cfg, backend: b, tracker: t, metrics: m, now: time.Now, synced: make(chan struct{}), needFull: true}
}

// Metrics returns the syncer's metrics.
func (s *Syncer) Metrics() *Metrics { return s.metrics }

// SyncOnce drains the tracker and syncs now, regardless of pacing.
func (s *Syncer) SyncOnce() error {
	st, ch := s.tracker.Drain()
	s.mu.Lock()
	s.pending = append(s.pending, ch.All()...)
	s.triggers = append(s.triggers, ch.TriggerTimes...)
	full := s.needFull || ch.Nodes || (s.cfg.SyncPeriod > 0 && s.now().Sub(s.lastFull) >= s.cfg.SyncPeriod)
	changed := s.pending
	s.mu.Unlock()

	s.metrics.EndpointChangesTotal.Add(float64(len(ch.Endpoints)))
	s.metrics.ServiceChangesTotal.Add(float64(len(ch.Services)))
	start := s.now()
	res, err := s.backend.Sync(st, changed, full)
	elapsed := s.now().Sub(start)

	s.mu.Lock()
	defer s.mu.Unlock()
	s.syncs++
	s.lastSync = s.now()
	if err != nil {
		s.failures++
		s.lastErr = err
		s.needFull = true // as kube-proxy: a failed restore forces a full one
		if full {
			s.metrics.RestoreFailures.Inc()
		} else {
			s.metrics.PartialRestoreFailures.Inc()
		}
		return fmt.Errorf("sync failed: %w", err)
	}
	s.lastErr = nil
	s.applied, s.appliedAt = ch.Seq, s.now()
	s.pending = nil
	s.needFull = false
	if full {
		s.lastFull = s.now()
		s.metrics.SyncFullDuration.Observe(elapsed.Seconds())
	} else {
		s.metrics.SyncPartialDuration.Observe(elapsed.Seconds())
	}
	s.metrics.SyncDuration.Observe(elapsed.Seconds())
	s.metrics.LastSyncTimestamp.SetToCurrentTime()
	for _, p := range []string{"internal", "external"} {
		s.metrics.NoLocalEndpoints.WithLabelValues(p).Set(float64(res.NoLocalEndpoints[p]))
	}
	done := s.now()
	for _, t := range s.triggers {
		if d := done.Sub(t); d >= 0 {
			s.metrics.NetworkProgramming.Observe(d.Seconds())
		}
	}
	s.triggers = nil
	if s.health != nil {
		s.health.Updated()
		s.healthErr = s.health.Sync(st)
	}
	s.conntrackErr = nil
	// Only what this drain brought, as kube-proxy: a change drained by a
	// failed sync does not clean after a later one.
	if s.conntrack != nil && s.conntrack.Required(ch, st) {
		start := s.now()
		n, err := s.conntrack.Clean(st)
		s.conntrackErr = err
		s.metrics.ConntrackReconcile.Observe(s.now().Sub(start).Seconds())
		s.metrics.ConntrackDeleted.Add(float64(n))
	}
	close(s.synced)
	s.synced = make(chan struct{})
	return nil
}

// Synced returns a channel closed after the next successful sync.
func (s *Syncer) Synced() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced
}

// Applied returns the tracker sequence number the last successful sync had
// drained, and when that sync finished: every API write whose events the
// tracker had received by then is programmed.
func (s *Syncer) Applied() (uint64, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied, s.appliedAt
}

// Stats reports how many syncs ran and failed, and the last error.
func (s *Syncer) Stats() (syncs, failures int, last error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.syncs, s.failures, s.lastErr
}

// Run syncs until ctx ends: once at start, then on each change no sooner
// than MinSyncPeriod after the previous sync, at least every SyncPeriod, and
// RetryPeriod after a failure. It returns ctx's error.
func (s *Syncer) Run(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	dirty := true // the first sync
	var next time.Time
	s.mu.Lock()
	health := s.health
	s.mu.Unlock()
	if health != nil {
		// As kube-proxy's SyncLoop: fresh at start, in case no sync ever
		// succeeds.
		health.Updated()
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.tracker.Changed():
			dirty = true
			if health != nil {
				health.Queued()
			}
		case <-timer.C:
		}
		now := s.now()
		s.mu.Lock()
		retrying := s.lastErr != nil
		sinceFull := now.Sub(s.lastFull)
		s.mu.Unlock()
		due := dirty || retrying || (s.cfg.SyncPeriod > 0 && sinceFull >= s.cfg.SyncPeriod)
		if !due {
			s.arm(timer, s.lastFullDeadline(now))
			continue
		}
		if now.Before(next) {
			s.arm(timer, next.Sub(now))
			continue
		}
		err := s.SyncOnce()
		dirty = false
		next = s.now().Add(s.cfg.MinSyncPeriod)
		wait := s.cfg.SyncPeriod
		if err != nil {
			wait = s.cfg.RetryPeriod
		}
		if wait <= 0 {
			wait = time.Hour
		}
		s.arm(timer, wait)
		if errors.Is(err, context.Canceled) {
			return err
		}
	}
}

func (s *Syncer) lastFullDeadline(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.SyncPeriod <= 0 {
		return time.Hour
	}
	return max(time.Millisecond, s.lastFull.Add(s.cfg.SyncPeriod).Sub(now))
}

func (s *Syncer) arm(t *time.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(d)
}
