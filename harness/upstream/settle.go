package upstream

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sync is the kube-proxy sync that Settle found: it started after the
// change was queued and has ended.
type Sync struct {
	// Started and Ended bound the sync. Started is an estimate a little
	// early (LastSync minus the sync's duration; LastSync is set just before
	// the duration is observed); it is zero when more than one sync ran
	// between Settle's two scrapes.
	Started, Ended time.Time
	// Duration is the sync's own duration, known only when exactly one sync
	// ran between the two scrapes (else 0).
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
// scrape S1. A sync that was already running at S1 may have read its state
// before the change arrived, so the first sync to end after S1 proves
// nothing by itself. Syncs are serial (one runner goroutine), so a later
// scrape S2 proves it when:
//
//   - S2.Syncs-S1.Syncs >= 2: at most one of those was in progress at S1,
//     the other started after S1, hence after the change was queued; or
//   - S2.Syncs-S1.Syncs == 1 and S2.LastSync-(S2.SyncSeconds-S1.SyncSeconds)
//     >= S1.LastQueued: that one sync's start (its end minus its duration)
//     is after the change was queued.
//
// A failed kube-proxy sync (SyncErrors grew) ends the wait with
// ErrSyncFailed; so does timeout (no sync queued, or none proven).
func (k *KubeProxy) Settle(ctx context.Context, since time.Time, timeout time.Duration) (Sync, error) {
	s, err := settle(ctx, k.Scrape, since, timeout, settleInterval)
	if err != nil {
		return s, fmt.Errorf("kube-proxy on %s did not settle (log %s): %w", k.cfg.Node, k.LogPath(), err)
	}
	return s, nil
}

// settle is Settle over any scrape function (a fake in tests).
func settle(ctx context.Context, scrape func(context.Context) (Metrics, error), since time.Time, timeout, interval time.Duration) (Sync, error) {
	var s1 Metrics
	var found Sync
	queued := false
	err := poll(ctx, interval, timeout, "a sync after the change", func() (bool, error) {
		m, err := scrape(ctx)
		if err != nil {
			return false, err
		}
		if !queued {
			if !m.LastQueued.Before(since) {
				s1, queued = m, true
			}
			return false, nil
		}
		if m.SyncErrors > s1.SyncErrors {
			return false, &fatalError{fmt.Errorf("%w: %d since the change", ErrSyncFailed, m.SyncErrors-s1.SyncErrors)}
		}
		s, ok := proves(s1, m)
		found = s
		return ok, nil
	})
	if err != nil && !queued {
		return Sync{}, fmt.Errorf("%w after %s: %w", errNoQueue, since.Format(time.RFC3339Nano), err)
	}
	return found, err
}

// proves applies Settle's rule to the scrapes s1 and s2.
func proves(s1, s2 Metrics) (Sync, bool) {
	switch n := s2.Syncs - s1.Syncs; {
	case n >= 2:
		return Sync{Ended: s2.LastSync}, true
	case n == 1:
		d := time.Duration((s2.SyncSeconds - s1.SyncSeconds) * float64(time.Second))
		start := s2.LastSync.Add(-d)
		if !s2.LastSync.IsZero() && !start.Before(s1.LastQueued) {
			return Sync{Started: start, Ended: s2.LastSync, Duration: d}, true
		}
	}
	return Sync{}, false
}
