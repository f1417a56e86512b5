package upstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Sync is the kube-proxy sync that Settle found: it started after the
// change was queued and has ended.
type Sync struct {
	// Started and Ended bound the sync. Started is an estimate a little
	// early (LastSync minus the sync's duration; LastSync is set just before
	// the duration is observed); it is zero when the proof was "two syncs
	// since S1", which leaves the start unknown.
	Started, Ended time.Time
	// Duration is the sync's own duration, known only when exactly one sync
	// ran since a scrape Settle has seen (else 0).
	Duration time.Duration
}

// settleInterval is how often Settle scrapes.
const settleInterval = 25 * time.Millisecond

// errNoQueue says kube-proxy queued no sync after the write.
var errNoQueue = errors.New("kube-proxy queued no sync")

// ErrSyncFailed says kube-proxy reported a failed sync while Settle waited.
var ErrSyncFailed = errors.New("kube-proxy reported a failed sync")

// Settle waits (timeout at most) until a sync that started after since (a
// time taken before the API write) has completed, and returns that sync.
// It reads only kube-proxy's metrics, never the rules under test.
//
// The rule: poll Scrape until LastQueued >= since, i.e. kube-proxy has
// queued a sync for a change it received after the write began; call that
// scrape S1 and Q its LastQueued. A sync that was already running at S1
// may have read its state before the change arrived, so the first sync to
// end after S1 proves nothing by itself. Syncs are serial (one runner
// goroutine), so a later scrape S2 proves it when:
//
//   - S2.Syncs-S1.Syncs >= 2: at most one of those was in progress at S1,
//     the other started after S1, hence after the change was queued; or
//   - S2.Syncs-S1.Syncs == 1 and S2.LastSync-(S2.SyncSeconds-S1.SyncSeconds)
//     >= Q: that one sync's start (its end minus its duration) is after the
//     change was queued.
//
// The second form holds for any earlier scrape B in place of S1 (the
// histogram's sum grows by every sync's duration, so
// S.LastSync-(S.SyncSeconds-B.SyncSeconds) is never later than the last
// sync's start), S1 and S2 included. Settle remembers the sum at each
// sync count it has seen (every Scrape of this KubeProxy records it) and
// applies it to every scrape from S1 on, with the latest B before the
// scrape's last sync: so a sync that ran after the change but ended before
// S1 (kube-proxy was quicker than Settle's first look, as when several
// nodes are settled one after the other) is found at once instead of
// waiting for another sync that may not come before the periodic resync.
//
// A failed kube-proxy sync (SyncErrors grew) ends the wait with
// ErrSyncFailed; so does timeout (no sync queued, or none proven). When a
// batch of writes is settled, LastQueued >= since may come from the first
// of them; take since before the last write to be sure every write of the
// batch was queued.
func (k *KubeProxy) Settle(ctx context.Context, since time.Time, timeout time.Duration) (Sync, error) {
	s, err := settle(ctx, k.Scrape, &k.history, since, timeout, settleInterval)
	if err != nil {
		return s, fmt.Errorf("kube-proxy on %s did not settle (log %s): %w", k.cfg.Node, k.LogPath(), err)
	}
	return s, nil
}

// syncHistory is the histogram sum seen at each sync count.
type syncHistory struct {
	mu   sync.Mutex
	sums map[uint64]float64
}

func (h *syncHistory) record(m Metrics) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sums == nil {
		h.sums = map[uint64]float64{0: 0}
	}
	h.sums[m.Syncs] = m.SyncSeconds
}

// before returns the largest count below n that h has seen, and its sum
// (count 0, sum 0, is always known).
func (h *syncHistory) before(n uint64) (uint64, float64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var best uint64
	var sum float64
	for c, s := range h.sums {
		if c < n && c >= best {
			best, sum = c, s
		}
	}
	return best, sum
}

// settle is Settle over any scrape function (a fake in tests).
func settle(ctx context.Context, scrape func(context.Context) (Metrics, error), h *syncHistory, since time.Time, timeout, interval time.Duration) (Sync, error) {
	var s1 Metrics
	var found Sync
	queued := false
	err := poll(ctx, interval, timeout, "a sync after the change", func() (bool, error) {
		m, err := scrape(ctx)
		if err != nil {
			return false, err
		}
		h.record(m)
		if !queued {
			if m.LastQueued.Before(since) {
				return false, nil
			}
			s1, queued = m, true
		}
		if m.SyncErrors > s1.SyncErrors {
			return false, &fatalError{fmt.Errorf("%w: %d since the change", ErrSyncFailed, m.SyncErrors-s1.SyncErrors)}
		}
		if s, ok := proves(s1, m); ok {
			found = s
			return true, nil
		}
		c, sum := h.before(m.Syncs)
		s, ok := lastSyncAfter(m, s1.LastQueued, c, sum)
		found = s
		return ok, nil
	})
	if err != nil && !queued {
		return Sync{}, fmt.Errorf("%w after %s: %w", errNoQueue, since.Format(time.RFC3339Nano), err)
	}
	return found, err
}

// proves applies the two-scrape rule to S1 and a later scrape s2.
func proves(s1, s2 Metrics) (Sync, bool) {
	switch n := s2.Syncs - s1.Syncs; {
	case n >= 2:
		return Sync{Ended: s2.LastSync}, true
	case n == 1:
		return lastSyncAfter(s2, s1.LastQueued, s1.Syncs, s1.SyncSeconds)
	}
	return Sync{}, false
}

// lastSyncAfter: m's last sync started at or after q, judged from a
// baseline scrape that had seen count syncs summing sum seconds.
func lastSyncAfter(m Metrics, q time.Time, count uint64, sum float64) (Sync, bool) {
	if m.Syncs <= count || m.LastSync.IsZero() {
		return Sync{}, false
	}
	d := time.Duration((m.SyncSeconds - sum) * float64(time.Second))
	start := m.LastSync.Add(-d)
	if start.Before(q) {
		return Sync{}, false
	}
	s := Sync{Started: start, Ended: m.LastSync}
	if m.Syncs-count == 1 {
		s.Duration = d
	}
	return s, true
}
