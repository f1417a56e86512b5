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
const settleInterval = 10 * time.Millisecond

// errNoQueue says kube-proxy queued no sync after the write.
var errNoQueue = errors.New("kube-proxy queued no sync")

// ErrSyncFailed says kube-proxy reported a failed sync while Settle waited.
var ErrSyncFailed = errors.New("kube-proxy reported a failed sync")

// Change is a write to the API that Settle waits for kube-proxy to program.
type Change struct {
	// Since is a time taken before the write (before the last write, for a
	// batch: LastQueued >= Since may come from the first of them).
	Since time.Time
	// Before is a scrape of this kube-proxy taken before the write, or nil.
	// With it, a sync failure or a programming observation between the
	// write and Settle's first look counts.
	Before *Metrics
	// Programmed is how many EndpointSlice writes of the change carry
	// endpoints.kubernetes.io/last-change-trigger-time. kube-proxy observes
	// each in kubeproxy_network_programming_duration_seconds once, after the
	// sync that consumed it applied its rules, so that many observations
	// since Before prove the change programmed (nobody else may write the
	// run's API). Needs Before; Service writes carry no trigger time.
	Programmed int
	// Nudge, when set, writes something that queues another sync and
	// programs nothing (a slice of no Service). Settle calls it once the
	// change is queued and again after every sync that ends without proving
	// it, so that a proof by the next sync does not wait for kube-proxy's
	// hourly resync (with --iptables-min-sync-period=0 every sync starts at
	// once, and its start estimate dates it before the queue).
	Nudge func(context.Context) error
}

// Settle waits (timeout at most) until kube-proxy has completed a sync
// that started after it queued the change, and returns that sync. It
// reads only kube-proxy's metrics, never the rules under test.
//
// The rule: poll Scrape until LastQueued >= c.Since, i.e. kube-proxy has
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
// kube-proxy stamps LastSync before its health-check and conntrack work,
// which the duration counts, so the estimate is early: it can fail to
// prove a sync, never prove a wrong one.
//
// A third proof does without the start: a scrape D with ChangesPending
// == 0 whose LastQueued equals the previous scrape's (>= Since) shows
// that a sync Y has taken every change recorded before that queue time,
// ours included (kube-proxy records a change before it queues the sync,
// and a sync takes the pending changes when it starts), so Y started
// after our change. Y has ended at D or is still running, so the first
// sync to end after D is Y or a later one: any later scrape with more
// syncs than D proves it. (Requiring the same LastQueued in two scrapes
// rules out a change that arrived while D's gauges were being read.)
//
// The fourth is c.Programmed (above), which needs no sync count at all.
//
// With kube-proxy's default --iptables-min-sync-period (1 s) syncs are far
// enough apart for Settle's polling to see the count before the change's
// sync (tested). With 0, a sync can start and end between two looks, and
// nothing but another sync proves it: v1.37 has no periodic sync before an
// hour (--iptables-sync-period is only the retry interval after a
// failure), so give a Nudge, or stamped slice writes, or settle every node
// at once (SettleAll) to keep the first look early.
//
// A failed kube-proxy sync (SyncErrors grew since Before, or since S1)
// ends the wait with ErrSyncFailed; so does timeout (no sync queued, or
// none proven).
func (k *KubeProxy) Settle(ctx context.Context, c Change, timeout time.Duration) (Sync, error) {
	s, err := settle(ctx, k.Scrape, &k.history, c, timeout, settleInterval)
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
func settle(ctx context.Context, scrape func(context.Context) (Metrics, error), h *syncHistory, c Change, timeout, interval time.Duration) (Sync, error) {
	var s1, prev, drained Metrics
	if c.Before != nil {
		h.record(*c.Before)
		prev = *c.Before
	}
	var found Sync
	queued, isDrained := false, false
	nudges, nudgedAt := 0, uint64(0) // nudges made, and the sync count at the last
	err := poll(ctx, interval, timeout, "a sync after the change", func() (bool, error) {
		m, err := scrape(ctx)
		if err != nil {
			return false, err
		}
		h.record(m)
		if !queued && !m.LastQueued.Before(c.Since) {
			s1, queued = m, true
		}
		if err := c.failed(s1, m); err != nil {
			return false, err
		}
		if c.programmed(m) {
			found = Sync{Ended: m.LastSync}
			return true, nil
		}
		if !queued {
			prev = m
			return false, nil
		}
		if s, ok := proves(s1, m); ok {
			found = s
			return true, nil
		}
		if isDrained && m.Syncs > drained.Syncs {
			found = afterDrain(m, drained)
			return true, nil
		}
		if !isDrained && m.ChangesPending == 0 && m.LastQueued.Equal(prev.LastQueued) && !prev.LastQueued.Before(c.Since) {
			drained, isDrained = m, true
		}
		prev = m
		n, sum := h.before(m.Syncs)
		if s, ok := lastSyncAfter(m, s1.LastQueued, n, sum); ok {
			found = s
			return true, nil
		}
		if c.Nudge != nil && (nudges == 0 || m.Syncs > nudgedAt) {
			nudges, nudgedAt = nudges+1, m.Syncs
			if err := c.Nudge(ctx); err != nil {
				return false, &fatalError{fmt.Errorf("could not nudge kube-proxy: %w", err)}
			}
		}
		return false, nil
	})
	if err != nil && !queued {
		return Sync{}, fmt.Errorf("%w after %s: %w", errNoQueue, c.Since.Format(time.RFC3339Nano), err)
	}
	return found, err
}

// programmed: m has observed the change's stamped slice writes.
func (c Change) programmed(m Metrics) bool {
	return c.Before != nil && c.Programmed > 0 && m.Programming-c.Before.Programming >= uint64(c.Programmed)
}

// failed: kube-proxy has reported a failed sync since Before (or, without
// it, since s1; nothing before the queue), as a fatal error for poll.
func (c Change) failed(s1, m Metrics) error {
	base := s1
	if c.Before != nil {
		base = *c.Before
	} else if m.LastQueued.Before(c.Since) {
		return nil
	}
	if m.SyncErrors > base.SyncErrors {
		return &fatalError{fmt.Errorf("%w: %d since the change", ErrSyncFailed, m.SyncErrors-base.SyncErrors)}
	}
	return nil
}

// afterDrain is the sync proven by a scrape m with more syncs than the
// drained scrape d: its end, and its duration and (early) start when it
// is the only one since d.
func afterDrain(m, d Metrics) Sync {
	s := Sync{Ended: m.LastSync}
	if m.Syncs-d.Syncs == 1 {
		s.Duration = time.Duration((m.SyncSeconds - d.SyncSeconds) * float64(time.Second))
		s.Started = m.LastSync.Add(-s.Duration)
	}
	return s
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

// SettleAll runs Settle on every kube-proxy at once (each polls its own
// /metrics) and returns their syncs in order; the error joins every
// node's.
func SettleAll(ctx context.Context, proxies []*KubeProxy, since time.Time, timeout time.Duration) ([]Sync, error) {
	out := make([]Sync, len(proxies))
	errs := make([]error, len(proxies))
	var wg sync.WaitGroup
	for i, k := range proxies {
		wg.Go(func() { out[i], errs[i] = k.Settle(ctx, Change{Since: since}, timeout) })
	}
	wg.Wait()
	return out, errors.Join(errs...)
}
