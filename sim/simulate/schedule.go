package simulate

import (
	"math"
	"sort"
	"time"

	"github.com/kpsim/kpsim/sim/engine"
)

// ctlEvent is a change on one node at one time: the API's version of a
// service port (a write of the timeline), or its rules' version (the end
// of a sync that picked the write up).
type ctlEvent struct {
	at      int64
	svc, gv int32
	program bool
}

// Control events at equal times: programming first (rules are in place
// from a sync's end), then API writes, then the runner's own timers.
const (
	ctlNone = iota
	ctlProgram
	ctlStep
	ctlSyncer
)

// schedule runs the node's sync runner (engine.Syncer) over the timeline:
// every write asks for a sync; a sync reads the state when it starts and
// applies it when it ends, after the cost model's sync time. Neither
// depends on the traffic, so the node's whole control schedule is computed
// up front, in the order the events take effect (a connection at time t
// sees every event at or before t). It also records the node's syncs and
// each step's exposure window. It runs until every step is in the rules
// (so that every window is measured, even one that ends after the
// traffic) and at least to the end of the traffic (so that periodic syncs
// during it are counted).
func (r *nodeRun) schedule() []ctlEvent {
	w := r.w
	steps := w.steps
	pp := r.md.partSync[r.ni]
	cfg := r.md.scfg
	cfg.Duration = func(engine.SyncInfo) time.Duration { return time.Duration(pp) }
	sy := engine.NewSyncer(cfg)
	rule := make([]int32, len(w.svcs))
	mark := make([]int32, len(w.svcs))
	for s := range w.svcs {
		rule[s], mark[s] = w.svcs[s].gvs[0], -1
	}
	var (
		evs      []ctlEvent
		pend     []engine.Sync
		changed  []int32
		nextStep int
		progStep = -1
	)
	limit := w.tr.span + int64(24*time.Hour)
	next := func() (int64, int) {
		at, kind := int64(math.MaxInt64), ctlNone
		if len(pend) > 0 {
			at, kind = pend[0].End, ctlProgram
		}
		if nextStep < len(steps) && steps[nextStep].at < at {
			at, kind = steps[nextStep].at, ctlStep
		}
		if t, ok := sy.Next(); ok && t < at {
			at, kind = t, ctlSyncer
		}
		return at, kind
	}
	for {
		at, kind := next()
		if kind == ctlNone || at > limit || (at > w.tr.span && progStep >= len(steps)-1) {
			break
		}
		switch kind {
		case ctlProgram:
			s := pend[0]
			pend = pend[1:]
			r.res.syncs = append(r.res.syncs, syncRec{dur: s.End - s.Start, periodic: s.Changes == 0})
			upto := sort.Search(len(steps), func(i int) bool { return steps[i].at > s.Start }) - 1
			changed = changed[:0]
			for k := progStep + 1; k <= upto; k++ {
				st := &steps[k]
				if st.writes > 0 {
					r.res.window[k] = s.End - st.at
				}
				for _, g := range st.changes {
					sv := w.gvs[g].svc
					if mark[sv] < 0 {
						changed = append(changed, sv)
					}
					mark[sv] = g
				}
			}
			progStep = max(progStep, upto)
			for _, sv := range changed {
				g := mark[sv]
				mark[sv] = -1
				if g != rule[sv] {
					evs = append(evs, ctlEvent{at: s.End, svc: sv, gv: g, program: true})
					rule[sv] = g
				}
			}
		case ctlStep:
			writes := 0
			for nextStep < len(steps) && steps[nextStep].at == at {
				st := &steps[nextStep]
				for _, g := range st.changes {
					evs = append(evs, ctlEvent{at: at, svc: w.gvs[g].svc, gv: g})
				}
				writes += st.writes
				nextStep++
			}
			if writes > 0 {
				// One informer notification per instant: the runner
				// coalesces the writes of one instant anyway.
				sy.Request(at)
			}
			pend = append(pend, sy.Advance(at)...)
		case ctlSyncer:
			pend = append(pend, sy.Advance(at)...)
		}
	}
	return evs
}
