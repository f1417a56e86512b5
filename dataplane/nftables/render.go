package nftables

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Renderer renders one node's table and remembers what the kernel took (see
// Commit), so that a partial render emits only what changed. It is not safe
// for concurrent use.
type Renderer struct {
	cfg    Config
	mark   string
	cat    proxy.Categorizer
	memory *proxy.EndpointMemory // keep-deleted-endpoint fault
	// txs mints transactions: the Backend's Interface, or a private Fake's
	// context (which writes the same commands).
	txs knftables.Interface

	committed *state // what the kernel holds; nil before the first commit
	pending   *state // the last render, until Commit
	needFull  bool   // the last render was not committed
	// now is the clock of stale chain deletion (time.Now; tests set it).
	now func() time.Time
}

// state is the table as a render leaves it: the record of each service port
// and the owners of each shared element.
type state struct {
	services map[cluster.ServicePortName]*svcRecord
	shared   map[elemKey]owners
	chains   map[string]chainUse // the fast layout's shared chains
	noLocal  [2]int              // internal, external
	// stale are the kube-proxy layout's service chains flushed and left
	// in place, with when: kube-proxy deletes a stale chain in the first
	// sync that starts more than a second after the one that flushed it
	// (kernels before 6.2 notice late that a chain is unreferenced).
	stale []staleChain
	// overlay marks a partial render's state: only the changed service
	// ports and touched elements, to be applied over the committed state.
	overlay bool
}

// staleChain is a flushed chain waiting for its deletion.
type staleChain struct {
	name    string
	flushed time.Time
}

// staleDelay is how long kube-proxy leaves a flushed chain before deleting
// it (syncProxyRules: chains stale since before start minus one second).
const staleDelay = time.Second

// owners are the service ports that own a shared element, with the element
// each wants. Most elements have one owner: a slice is cheaper than a map.
type owners []owner

type owner struct {
	spn cluster.ServicePortName
	el  sharedElem
}

// without returns o without spn's entry (a new slice: o may be shared with
// the committed state).
func (o owners) without(spn cluster.ServicePortName) owners {
	out := make(owners, 0, len(o))
	for _, x := range o {
		if x.spn != spn {
			out = append(out, x)
		}
	}
	return out
}

// with returns o with spn's entry set to el (a new slice).
func (o owners) with(spn cluster.ServicePortName, el sharedElem) owners {
	return append(o.without(spn), owner{spn, el})
}

// chainUse is a shared chain (whose content depends on its name only) and
// the number of service ports that use it: thousands may share one, so a
// count rather than a set keeps a partial render independent of them.
type chainUse struct {
	c *chainRec
	n int
}

func newState() *state {
	return &state{services: map[cluster.ServicePortName]*svcRecord{}, shared: map[elemKey]owners{}, chains: map[string]chainUse{}}
}

// Stats describes one render.
type Stats struct {
	// Full reports a full render (everything rewritten); First a full
	// render that also recreated the table.
	Full, First bool
	// Operations is the transaction's length (knftables operations).
	Operations int
	// ServicePorts is the number of service ports whose objects were
	// compared (all of them in a full render, the changed ones otherwise).
	ServicePorts int
	// ChainsWritten counts chains created or flushed and refilled;
	// Rules the rules added; Elements the element additions and
	// deletions; Deleted the chains, sets and maps deleted.
	ChainsWritten, Rules, Elements, Deleted int
	// NoLocalEndpoints counts service ports with a Local policy and no
	// local endpoint, by "internal" and "external".
	NoLocalEndpoints map[string]int
}

// NewRenderer returns a renderer for cfg's node. It fails on a bad config.
func NewRenderer(cfg Config) (*Renderer, error) {
	if err := cfg.defaults(); err != nil {
		return nil, fmt.Errorf("could not configure the nftables renderer: %w", err)
	}
	r := &Renderer{
		cfg:  cfg,
		mark: fmt.Sprintf("%#x", uint32(1)<<cfg.MasqueradeBit),
		cat:  cfg.Faults.Categorizer(cfg.NodeName, cfg.PreferSameNode),
		txs:  knftables.NewFake(knftables.IPv4Family, cfg.Table),
		now:  time.Now,
	}
	if cfg.Faults.Has(proxy.FaultKeepDeletedEndpoint) {
		r.memory = proxy.NewEndpointMemory()
	}
	return r, nil
}

// Config returns the renderer's configuration, defaults filled.
func (r *Renderer) Config() Config { return r.cfg }

// Commit records that the kernel took the last render. Call it only after
// the transaction ran; after a failure call Abort (or nothing) and the next
// render is a full one over what was last committed.
func (r *Renderer) Commit() {
	switch {
	case r.pending == nil:
	case r.pending.overlay:
		r.committed.apply(r.pending)
	default:
		r.committed = r.pending
	}
	r.pending = nil
	r.needFull = false
}

// Abort forgets the last render: the kernel did not take it. The next
// render is a full one.
func (r *Renderer) Abort() {
	r.pending = nil
	r.needFull = true
}

// Reset forgets everything committed: the next render recreates the table.
func (r *Renderer) Reset() {
	r.committed = nil
	r.pending = nil
	r.needFull = false
}

// Render renders st for the configured node as one transaction. changed
// names the service ports whose Service or endpoints changed since the last
// committed render; full forces a full render. The first render (and the
// first after Reset) recreates the table; a full render rewrites every chain
// and refills every map, deleting what became stale; a partial render
// compares only the changed service ports' objects with the committed ones
// and emits the chains, sets, maps and elements that differ, so its size
// does not depend on the number of unchanged service ports. Node label or
// zone changes need a full render.
func (r *Renderer) Render(st *cluster.State, changed []cluster.ServicePortName, full bool) (*knftables.Transaction, Stats, error) {
	if st == nil {
		return nil, Stats{}, fmt.Errorf("could not render nftables rules: no cluster state")
	}
	if r.pending != nil {
		// The previous render was neither committed nor aborted: assume
		// the kernel did not take it.
		r.Abort()
	}
	first := r.committed == nil
	full = full || first || r.needFull
	cat := r.cat
	if n := st.Nodes[r.cfg.NodeName]; n != nil {
		cat.Zone = n.Zone
	}
	e := &emitter{}
	stats := Stats{Full: full, First: first}
	now := r.now()
	var carried []staleChain
	if !first {
		for _, c := range r.committed.stale {
			if c.flushed.Before(now.Add(-staleDelay)) {
				e.del(1, &knftables.Chain{Name: c.name})
				stats.Deleted++
			} else {
				carried = append(carried, c)
			}
		}
	}
	var next *state
	if full {
		next = r.renderFull(st, cat, e, first, &stats)
	} else {
		next = r.renderPartial(st, changed, cat, e, &stats)
	}
	next.stale = r.staleAfter(carried, e, now)
	tx := r.txs.NewTransaction()
	e.run(tx)
	stats.Operations = tx.NumOperations()
	stats.NoLocalEndpoints = map[string]int{"internal": next.noLocal[0], "external": next.noLocal[1]}
	r.pending = next
	return tx, stats, nil
}

// staleAfter is the stale list after a render: the chains it flushed, and
// those carried over (not yet due) that it did not write again (a chain
// written again is live; kube-proxy forgets it as stale).
func (r *Renderer) staleAfter(carried []staleChain, e *emitter, now time.Time) []staleChain {
	out := make([]staleChain, 0, len(carried)+len(e.stale))
	for _, c := range carried {
		if !e.written[c.name] {
			out = append(out, c)
		}
	}
	for _, name := range e.stale {
		out = append(out, staleChain{name: name, flushed: now})
	}
	return out
}

// record renders one service port of st, or returns nil when it has no
// rules (removed, headless or without a cluster IP).
func (r *Renderer) record(st *cluster.State, spn cluster.ServicePortName, cat proxy.Categorizer) *svcRecord {
	sp := st.Services[spn]
	if sp == nil || sp.Headless || !sp.ClusterIP.IsValid() || !sp.ClusterIP.Is4() {
		return nil
	}
	eps := st.Endpoints[spn]
	if r.memory != nil {
		eps = r.memory.Merge(spn, eps)
	}
	return r.buildRecord(newView(spn, sp, cat.Categorize(eps, sp)))
}

func (r *Renderer) renderFull(st *cluster.State, cat proxy.Categorizer, e *emitter, first bool, stats *Stats) *state {
	old := r.committed
	if old == nil {
		old = newState()
	}
	next := newState()
	if first {
		// Recreate the table: nothing of an earlier run survives (add
		// first, so that the delete finds it).
		e.add(0, &knftables.Table{})
		e.del(0, &knftables.Table{})
	}
	e.add(0, &knftables.Table{Comment: knftables.PtrTo("rules for kube-proxy")})

	b := r.baseRecord()
	for _, c := range b.chains {
		r.writeChain(e, c, !first, stats)
	}
	for _, o := range b.objs {
		e.add(3, o.object())
		if !first {
			e.flush(2, o.nameOnly())
		}
	}
	for _, el := range b.elems {
		e.add(4, el.object(el.container, el.isMap))
		stats.Elements++
	}

	names := st.SortedServicePorts()
	stats.ServicePorts = len(names)
	for _, spn := range names {
		rec := r.record(st, spn, cat)
		if rec == nil {
			continue
		}
		next.services[spn] = rec
		r.diffService(e, old.services[spn], rec, true, stats)
	}
	// Stale service ports.
	var gone []cluster.ServicePortName
	for spn := range old.services {
		if next.services[spn] == nil {
			gone = append(gone, spn)
		}
	}
	cluster.SortNames(gone)
	for _, spn := range gone {
		r.diffService(e, old.services[spn], nil, true, stats)
	}

	// Shared chains: rewritten; stale ones deleted.
	for _, rec := range next.services {
		for _, c := range rec.sharedChains {
			next.ownChain(c)
		}
	}
	for _, name := range sortedKeys(next.chains) {
		r.writeChain(e, next.chains[name].c, old.chains[name].n > 0, stats)
	}
	for _, name := range sortedKeys(old.chains) {
		if next.chains[name].n == 0 {
			e.flush(1, &knftables.Chain{Name: name})
			e.del(5, &knftables.Chain{Name: name})
			stats.Deleted++
		}
	}
	// Shared elements: the containers were flushed (or are new); add the
	// effective element of every key.
	for _, rec := range next.services {
		for _, s := range rec.shared {
			next.own(s.id(), rec.spn, s)
		}
		next.count(rec, 1)
	}
	keys := sortedElemKeys(next.shared)
	for _, k := range keys {
		s, _ := next.shared[k].effective()
		e.add(4, s.object(s.container, s.isMap))
		stats.Elements++
	}
	return next
}

func (r *Renderer) renderPartial(st *cluster.State, changed []cluster.ServicePortName, cat proxy.Categorizer, e *emitter, stats *Stats) *state {
	old := r.committed
	// next is an overlay over old: the changed service ports' records (nil
	// when gone) and the owner sets of the touched shared elements. old is
	// left intact until Commit, so that a failed transaction costs
	// nothing.
	next := &state{services: map[cluster.ServicePortName]*svcRecord{}, shared: map[elemKey]owners{}, chains: map[string]chainUse{}, noLocal: old.noLocal, overlay: true}
	names := slices.Clone(changed)
	cluster.SortNames(names)
	names = slices.Compact(names)
	stats.ServicePorts = len(names)
	ownersOf := func(k elemKey) owners {
		if o, ok := next.shared[k]; ok {
			return o
		}
		return old.shared[k]
	}
	use := func(c *chainRec, delta int) {
		u, ok := next.chains[c.name]
		if !ok {
			u = old.chains[c.name]
		}
		u.c, u.n = c, u.n+delta
		next.chains[c.name] = u
	}
	for _, spn := range names {
		prev := old.services[spn]
		rec := r.record(st, spn, cat)
		next.services[spn] = rec
		r.diffService(e, prev, rec, false, stats)
		if prev != nil {
			for _, s := range prev.shared {
				next.shared[s.id()] = ownersOf(s.id()).without(spn)
			}
			for _, c := range prev.sharedChains {
				use(c, -1)
			}
			next.count(prev, -1)
		}
		if rec != nil {
			for _, s := range rec.shared {
				next.shared[s.id()] = ownersOf(s.id()).with(spn, s)
			}
			for _, c := range rec.sharedChains {
				use(c, 1)
			}
			next.count(rec, 1)
		}
	}
	for _, name := range sortedKeys(next.chains) {
		had, has := old.chains[name].n > 0, next.chains[name].n > 0
		switch {
		case has && !had:
			r.writeChain(e, next.chains[name].c, false, stats)
		case had && !has:
			e.flush(1, &knftables.Chain{Name: name})
			e.del(5, &knftables.Chain{Name: name})
			stats.Deleted++
		}
	}
	for _, k := range sortedElemKeys(next.shared) {
		before, had := old.shared[k].effective()
		after, has := next.shared[k].effective()
		switch {
		case had && has && before.elem.equal(after.elem):
		case had && has:
			e.del(2, before.object(before.container, before.isMap))
			e.add(4, after.object(after.container, after.isMap))
			stats.Elements += 2
		case had:
			e.del(2, before.object(before.container, before.isMap))
			stats.Elements++
		case has:
			e.add(4, after.object(after.container, after.isMap))
			stats.Elements++
		}
	}
	return next
}

// apply folds an overlay into s, in place.
func (s *state) apply(o *state) {
	for spn, rec := range o.services {
		if rec == nil {
			delete(s.services, spn)
		} else {
			s.services[spn] = rec
		}
	}
	for k, ow := range o.shared {
		if len(ow) == 0 {
			delete(s.shared, k)
		} else {
			s.shared[k] = ow
		}
	}
	for name, u := range o.chains {
		if u.n == 0 {
			delete(s.chains, name)
		} else {
			s.chains[name] = u
		}
	}
	s.noLocal = o.noLocal
	s.stale = o.stale
}

// diffService emits what turns prev into rec (either may be nil). In a full
// render every chain of rec is rewritten and its maps refilled; otherwise
// only what differs.
func (r *Renderer) diffService(e *emitter, prev, rec *svcRecord, full bool, stats *Stats) {
	// A set or map whose definition changes is deleted and re-added; the
	// rules that refer to it must go first, so all the service port's
	// chains are rewritten.
	rewriteAll := full
	if rec != nil {
		for _, o := range rec.objs {
			if p := prev.obj(o.name); p != nil && !p.sameDef(o) {
				rewriteAll = true
			}
		}
	}
	if rec != nil {
		for _, c := range rec.chains {
			p := prev.chain(c.name)
			if p != nil && !rewriteAll && p.sameRules(c) {
				continue
			}
			r.writeChain(e, c, p != nil, stats)
		}
	}
	// Stale chains: flushed first (dropping their references), deleted
	// last (after the elements that point at them); in the kube-proxy
	// layout, as kube-proxy does, deleted by the next render.
	if prev != nil {
		for _, c := range prev.chains {
			if rec.chain(c.name) != nil {
				continue
			}
			e.flush(1, &knftables.Chain{Name: c.name})
			if r.cfg.Layout == LayoutKubeProxy {
				e.stale = append(e.stale, c.name)
				continue
			}
			e.del(5, &knftables.Chain{Name: c.name})
			stats.Deleted++
		}
		for _, o := range prev.objs {
			if n := rec.obj(o.name); n == nil || !n.sameDef(o) {
				e.del(2, o.nameOnly())
				stats.Deleted++
			}
		}
	}
	if rec == nil {
		return
	}
	// A service port's own sets are the affinity sets, whose content is
	// the kernel's (clients recorded from the packet path): added when new
	// or redefined, re-added (a no-op) on a full sync, never flushed.
	for _, o := range rec.objs {
		if p := prev.obj(o.name); p == nil || !p.sameDef(o) || full {
			e.add(3, o.object())
		}
	}
}

// writeChain (re)writes a chain: created, or flushed when it exists, then
// filled.
func (r *Renderer) writeChain(e *emitter, c *chainRec, exists bool, stats *Stats) {
	if exists {
		// kube-proxy's ensureChain: add (a no-op when present) + flush.
		e.add(1, c.object())
		e.flush(1, &knftables.Chain{Name: c.name})
	} else {
		e.add(3, c.object())
	}
	for _, rl := range c.rules {
		obj := &knftables.Rule{Chain: c.name, Rule: rl.text}
		if rl.comment != "" {
			obj.Comment = knftables.PtrTo(rl.comment)
		}
		e.add(4, obj)
	}
	if e.written == nil {
		e.written = map[string]bool{}
	}
	e.written[c.name] = true
	stats.ChainsWritten++
	stats.Rules += len(c.rules)
}

func (s *state) own(k elemKey, spn cluster.ServicePortName, el sharedElem) {
	s.shared[k] = append(s.shared[k], owner{spn, el})
}

func (s *state) count(rec *svcRecord, sign int) {
	if rec.noLocalInternal {
		s.noLocal[0] += sign
	}
	if rec.noLocalExternal {
		s.noLocal[1] += sign
	}
}

func (s *state) ownChain(c *chainRec) {
	u := s.chains[c.name]
	u.c, u.n = c, u.n+1
	s.chains[c.name] = u
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// effective is the element the kernel holds for a key: the one wanted by
// the first owner in service port order (owners agree but for conflicting
// Services, where the choice is arbitrary but stable).
func (o owners) effective() (sharedElem, bool) {
	if len(o) == 0 {
		return sharedElem{}, false
	}
	best := o[0]
	for _, x := range o[1:] {
		if cluster.CompareNames(x.spn, best.spn) < 0 {
			best = x
		}
	}
	return best.el, true
}

func sortedElemKeys[V any](m map[elemKey]V) []elemKey {
	out := make([]elemKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b elemKey) int {
		if c := strings.Compare(a.container, b.container); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	return out
}

// emitter collects operations in phases, so that the transaction is valid
// in the kernel whatever changed: (0) the table; (1) flush the chains to
// rewrite or delete, which drops their references; (2) delete elements,
// sets and maps, and flush static maps; (3) add chains, sets and maps;
// (4) add rules and elements; (5) delete stale chains, now unreferenced.
type emitter struct {
	phases [6][]op
	stale  []string // chains flushed and left for a later render to delete
	// written are the chains (re)written.
	written map[string]bool
}

type op struct {
	verb byte // 'a'dd, 'd'elete, 'f'lush
	obj  knftables.Object
}

func (e *emitter) add(p int, o knftables.Object)   { e.phases[p] = append(e.phases[p], op{'a', o}) }
func (e *emitter) del(p int, o knftables.Object)   { e.phases[p] = append(e.phases[p], op{'d', o}) }
func (e *emitter) flush(p int, o knftables.Object) { e.phases[p] = append(e.phases[p], op{'f', o}) }

func (e *emitter) run(tx *knftables.Transaction) {
	for _, ops := range e.phases {
		for _, o := range ops {
			switch o.verb {
			case 'a':
				tx.Add(o.obj)
			case 'd':
				tx.Delete(o.obj)
			case 'f':
				tx.Flush(o.obj)
			}
		}
	}
}
