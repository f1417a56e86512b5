package simulate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/apiserver"
	"github.com/kpsim/kpsim/sim/cluster"
	"github.com/kpsim/kpsim/sim/cost"
	"github.com/kpsim/kpsim/sim/engine"
	"github.com/kpsim/kpsim/sim/oracle"
	"github.com/kpsim/kpsim/sim/scenario"
)

// world is everything the per-node runs share. It is built once, single
// threaded, and only read afterwards.
type world struct {
	sc    *scenario.Scenario
	nodes []nodeInfo
	svcs  []svcInfo
	gvs   []gvInfo
	steps []stepInfo
	modes []*modeData
	tr    trafficPlan
	// rq is the clients with requests (nil without any).
	rq *reqPlan
	// svcByName finds a service port.
	svcByName map[cluster.ServicePortName]int32
	// unionCells is the sum of every service port's endpoint count.
	unionCells int32
	// cells is the sum over versions of their service port's endpoint count.
	cells int32
	// timeline service port (-1: none) and its bins.
	tlSvc  int32
	tlBin  int64
	tlBins int
	// Calibrations used.
	cals []cost.Calibration
	// affCheck marks, per service port under an affinity check, the client
	// nodes whose connections the oracle's affinity tracker follows.
	affCheck map[int32][]bool
	// keep marks the versions whose per-node counts outlive the node's run.
	keep []bool
	// extOf lists, per cluster IP entry, its external frontends (nil
	// without external clients); ext is the external traffic's plan.
	extOf [][]int32
	ext   *extPlan
	// seed is the run's seed (the load balancers' probe phases).
	seed uint64
	// loaded locates problems found after expansion (inputError).
	loaded *scenario.Loaded
	// nBase is the number of cluster IP entries: w.svcs[:nBase] are the
	// service ports, in name order; external frontends follow.
	nBase int32
}

type nodeInfo struct {
	name, zone string
	ip         netip.Addr
}

// svcInfo is one service port over the whole run. Its endpoint IDs are
// local: 0..k-1 over every endpoint any version of it had (sorted by
// address), so per-endpoint counters are small dense arrays.
type svcInfo struct {
	name  cluster.ServicePortName
	label string
	// via is how clients reach it: the cluster IP (a service port's own
	// entry), or, for an external frontend (traffic from outside the
	// cluster through a node port, an external IP or a load balancer), that
	// destination; base is the entry of the service port it fronts (itself
	// for a cluster IP entry). An external frontend has versions of its own
	// (the same states as its base's, rendered with engine.RenderExternal)
	// and its own engine per node, as the kernel has its own chains (ipvs:
	// virtual servers) per destination.
	via   cluster.Via
	base  int32
	proto engine.Proto
	eps   []netip.AddrPort // by local ID
	names []string         // "ip:port" by local ID
	// index and ids serve the rendering and the oracle's verdicts only
	// (buildWorld drops them once every mode is built: at 30,000 Services
	// they are some 50 MB of maps through the node runs).
	index map[string]int32
	ids   *engine.Interner
	gvs   []int32 // its versions in time order
	// unionOff is its offset in per-endpoint arrays that span versions.
	unionOff int32
}

// gvInfo is one version of a service port: its state from one API write
// (or the start) until the next write that changed it.
type gvInfo struct {
	svc     int32
	step    int32 // index of the step that created it; -1 for the initial state
	sp      *cluster.ServicePort
	eps     []*cluster.Endpoint
	cellOff int32
	// nodeDep: rules and expectations differ between nodes (internal
	// traffic policy Local, topology hints).
	nodeDep bool
	local   bool
}

// stepInfo is one API write of the timeline.
type stepInfo struct {
	at      int64
	desc    string
	writes  int
	changes []int32 // versions it created
}

// outcome is the oracle's expectation in compact form.
type outcome struct {
	kind    oracle.Kind
	allowed []uint64 // bitset over local endpoint IDs
	n       int32
	devs    []string
	// lost: the endpoints get the connection but their replies do not
	// reach the client (ipvs, externalTrafficPolicy Local without a local
	// endpoint).
	lost bool
}

func (o *outcome) allows(ep int32) bool {
	return ep >= 0 && int(ep>>6) < len(o.allowed) && o.allowed[ep>>6]&(1<<(uint(ep)&63)) != 0
}

// modeData is what one mode's runs share.
type modeData struct {
	name cluster.Mode
	mode engine.Mode
	ncfg engine.NodeConfig
	scfg engine.SyncConfig
	// rules and out are each version's rules and outcome (an index in
	// outs) on each node: one entry for a version that is the same on
	// every node, one per node for a node-dependent one, from at[g]
	// (ruleAt, outAt).
	rules []*engine.Rules
	out   []int32
	at    []int32
	dep   []bool
	outs  []outcome
	// fast is out in the per-connection form, slot by slot.
	fast []fastOutcome
	// eligible is, per version, the number of endpoints the oracle allows
	// from at least one node.
	eligible []int
	counts   []cost.Counts // per node, initial state
	fullSync []int64       // per node, ns
	partSync []int64       // per node, ns
	cal      string        // calibration used, for the report
	variant  string
	// method is how the engine self-check and the distribution checks
	// test the mode's draws (report.Method*).
	method string
	// fault is the engine fault injected into this mode (Options.Fault).
	fault engine.Fault
	// fullEst and partEst are the cost model's estimates for the node
	// with the longest full sync (nil without a model).
	fullEst, partEst *cost.Estimate
}

// slot is the index of version g on node ni in rules and out.
func (md *modeData) slot(g, ni int) int {
	if md.dep[g] {
		return int(md.at[g]) + ni
	}
	return int(md.at[g])
}

// ruleAt is version g's rules on node ni.
func (md *modeData) ruleAt(g, ni int) *engine.Rules { return md.rules[md.slot(g, ni)] }

// outAt is the index in outs of version g's outcome on node ni.
func (md *modeData) outAt(g, ni int) int32 { return md.out[md.slot(g, ni)] }

// apiTimeout bounds the wait for the informers after an API write.
const apiTimeout = 30 * time.Second

// captureTimeline applies every step of the events timeline through the
// cluster model's clientset, as the harness does, and records after each
// one the service ports whose state changed, as the informers delivered it.
// The initial state is snapshot first: the tracker mutates its maps.
func captureTimeline(ctx context.Context, m *apiserver.Model) (initial *cluster.State, steps []apiserver.Step, changes [][]changed, writes []int, err error) {
	st := m.State
	initial = &cluster.State{
		Services:  make(map[cluster.ServicePortName]*cluster.ServicePort, len(st.Services)),
		Endpoints: make(map[cluster.ServicePortName][]*cluster.Endpoint, len(st.Endpoints)),
		Nodes:     make(map[string]*cluster.Node, len(st.Nodes)),
	}
	for k, v := range st.Services {
		initial.Services[k] = v
	}
	for k, v := range st.Endpoints {
		initial.Endpoints[k] = v
	}
	for k, v := range st.Nodes {
		initial.Nodes[k] = v
	}
	steps = apiserver.Timeline(m.Loaded.Scenario)
	for i, s := range steps {
		before := m.Tracker.Seq()
		n, err := m.Cluster.Apply(ctx, s)
		if err != nil {
			return nil, nil, nil, nil, fmt.Errorf("could not apply timeline step %d (%s): %w", i+1, s, err)
		}
		deadline := time.Now().Add(apiTimeout)
		for m.Tracker.Seq() < before+uint64(n) {
			if time.Now().After(deadline) {
				return nil, nil, nil, nil, fmt.Errorf("timeline step %d (%s): the informers did not deliver %d write(s) within %s", i+1, s, n, apiTimeout)
			}
			if err := ctx.Err(); err != nil {
				return nil, nil, nil, nil, fmt.Errorf("timeline step %d: %w", i+1, err)
			}
			time.Sleep(100 * time.Microsecond)
		}
		state, ch := m.Tracker.Drain()
		var cs []changed
		for _, name := range ch.All() {
			cs = append(cs, changed{name: name, sp: state.Services[name], eps: state.Endpoints[name]})
		}
		changes = append(changes, cs)
		writes = append(writes, n)
	}
	return initial, steps, changes, writes, nil
}

type changed struct {
	name cluster.ServicePortName
	sp   *cluster.ServicePort
	eps  []*cluster.Endpoint
}

// buildWorld turns the captured states into versions, renders every
// version's rules per mode (per node where they differ) and asks the
// oracle what each must do.
func buildWorld(ctx context.Context, m *apiserver.Model, modes []cluster.Mode, o Options) (*world, error) {
	sc := m.Loaded.Scenario
	initial, tsteps, changes, writes, err := captureTimeline(ctx, m)
	if err != nil {
		return nil, err
	}
	// Everything from here on reads the captured states: the cluster
	// model's objects (two copies of each, the clientset's and the
	// informers') can go before the rules are rendered.
	m.Release()
	w := &world{sc: sc, svcByName: map[cluster.ServicePortName]int32{}, tlSvc: -1, cals: o.Calibrations, seed: m.Expanded.Seed, loaded: m.Loaded}
	for _, n := range initial.SortedNodes() {
		w.nodes = append(w.nodes, nodeInfo{name: n, zone: initial.Nodes[n].Zone, ip: initial.Nodes[n].IP})
	}
	if len(w.nodes) == 0 {
		return nil, fmt.Errorf("the scenario has no nodes")
	}
	for _, name := range initial.SortedServicePorts() {
		sp := initial.Services[name]
		s := int32(len(w.svcs))
		w.svcs = append(w.svcs, svcInfo{name: name, label: name.String(), proto: protoOf(sp), via: cluster.ViaClusterIP, base: s})
		w.svcByName[name] = s
		w.addVersion(s, -1, sp, initial.Endpoints[name])
	}
	w.nBase = int32(len(w.svcs))
	if err := w.addExternalEntries(); err != nil {
		return nil, err
	}
	for i, ts := range tsteps {
		si := stepInfo{at: int64(ts.At), desc: ts.String(), writes: writes[i]}
		for _, c := range changes[i] {
			s, ok := w.svcByName[c.name]
			if !ok || c.sp == nil {
				// Events never add or delete Services; a port that appears
				// or disappears here is not simulated.
				continue
			}
			si.changes = append(si.changes, w.addVersion(s, int32(i), c.sp, c.eps))
			for _, x := range w.externalOf(s) {
				si.changes = append(si.changes, w.addVersion(x, int32(i), c.sp, c.eps))
			}
		}
		w.steps = append(w.steps, si)
	}
	// Local endpoint IDs: every endpoint any version had, sorted (each
	// service port on its own, so on every CPU).
	cluster.ParallelFor(len(w.svcs), func(s int) {
		sv := &w.svcs[s]
		seen := map[netip.AddrPort]bool{}
		for _, g := range sv.gvs {
			for _, e := range w.gvs[g].eps {
				seen[netip.AddrPortFrom(e.IP, uint16(e.Port))] = true
			}
		}
		for ap := range seen {
			sv.eps = append(sv.eps, ap)
		}
		slices.SortFunc(sv.eps, func(a, b netip.AddrPort) int { return a.Compare(b) })
		sv.ids = engine.NewInterner()
		sv.index = make(map[string]int32, len(sv.eps))
		for i, ap := range sv.eps {
			sv.ids.ID(ap)
			name := ap.String()
			sv.names = append(sv.names, name)
			sv.index[name] = int32(i)
		}
	})
	for s := range w.svcs {
		sv := &w.svcs[s]
		sv.unionOff = w.unionCells
		w.unionCells += int32(len(sv.eps))
		for _, g := range sv.gvs {
			w.gvs[g].cellOff = w.cells
			w.cells += int32(len(sv.eps))
		}
	}
	if err := w.buildModes(modes, o); err != nil {
		return nil, err
	}
	for s := range w.svcs {
		w.svcs[s].index, w.svcs[s].ids = nil, nil
	}
	if err := w.planTraffic(); err != nil {
		return nil, err
	}
	w.pickTimeline()
	return w, nil
}

// externalOf lists entry s's external frontends.
func (w *world) externalOf(s int32) []int32 {
	if int(s) < len(w.extOf) {
		return w.extOf[s]
	}
	return nil
}

// addVersion appends a version of entry s made by step (-1: the initial
// state). A version's rules differ between nodes under a Local policy (the
// internal one for a cluster IP entry, the external one for an external
// frontend) and with topology hints.
func (w *world) addVersion(s int32, step int32, sp *cluster.ServicePort, eps []*cluster.Endpoint) int32 {
	g := int32(len(w.gvs))
	gi := gvInfo{svc: s, step: step, sp: sp, eps: eps}
	if sp != nil {
		policyLocal := sp.InternalLocal
		if w.svcs[s].via.External() {
			policyLocal = sp.ExternalLocal
		} else {
			gi.local = sp.InternalLocal
		}
		gi.nodeDep = policyLocal || slices.ContainsFunc(eps, func(e *cluster.Endpoint) bool {
			return len(e.ZoneHints) > 0 || len(e.NodeHints) > 0
		})
	}
	w.gvs = append(w.gvs, gi)
	w.svcs[s].gvs = append(w.svcs[s].gvs, g)
	return g
}

// buildModes builds every mode at once, one goroutine each (the rendering
// of 30,000 service ports per mode was seconds of a single-threaded
// start): buildMode only reads the world (its interners already hold
// every endpoint, so rendering assigns no ID) and writes its own
// modeData. w.modes keeps the order of modes.
func (w *world) buildModes(modes []cluster.Mode, o Options) error {
	mds := make([]*modeData, len(modes))
	errs := make([]error, len(modes))
	var wg sync.WaitGroup
	for i, name := range modes {
		wg.Go(func() { mds[i], errs[i] = w.buildMode(name, o) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	w.modes = append(w.modes, mds...)
	return nil
}

func protoOf(sp *cluster.ServicePort) engine.Proto {
	switch sp.Name.Protocol {
	case "UDP":
		return engine.UDP
	case "SCTP":
		return engine.SCTP
	}
	return engine.TCP
}

// buildMode sets up one mode from the scenario's proxy settings (node and
// sync configuration, injected fault, oracle), then renders every version
// with the oracle's outcomes, picks the calibration and computes the
// per-node counts and sync times.
func (w *world) buildMode(name cluster.Mode, o Options) (*modeData, error) {
	mode, err := engine.ModeOf(name)
	if err != nil {
		return nil, err
	}
	p := w.sc.Proxy
	md := &modeData{name: name, mode: mode}
	md.method, _ = w.testMethod(mode)
	md.ncfg = engine.NodeConfig{Mode: mode, IPVS: engine.IPVSConfig{Scheduler: p.IPVSScheduler}}
	if f, err := engine.ParseFault(o.Fault); err != nil {
		return nil, err
	} else if f.Mode() == mode {
		md.fault = f
		md.ncfg.IPTables.Fault, md.ncfg.NFTables.Fault, md.ncfg.IPVS.Fault = f, f, f
	}
	if p.IPTablesAffinity == "ipset" {
		md.ncfg.IPTables.RecentCapacity = proxy.IPSetMaxElem
	}
	md.scfg = engine.SyncConfig{MaxInterval: time.Hour}
	if p.MinSyncPeriod != nil {
		md.scfg.MinSyncPeriod = p.MinSyncPeriod.Duration
	}
	if mode == engine.IPVS && p.SyncPeriod != nil {
		// kube-proxy's ipvs proxier runs its sync loop every syncPeriod;
		// iptables and nftables use one hour (their runner's maxInterval).
		md.scfg.MaxInterval = p.SyncPeriod.Duration
	}
	or := oracle.Oracle{IPVSScheduler: p.IPVSScheduler}
	if p.IPTablesAffinity == "ipset" {
		or.RecentCapacity = proxy.IPSetMaxElem
	}
	if err := w.renderVersions(md, or); err != nil {
		return nil, err
	}
	cal, ok := w.calibration(md, o)
	w.syncCosts(md, cal, ok, o)
	return md, nil
}

// renderVersions renders every version's rules on every node and asks the
// oracle which endpoints each may reach. A version that no node-dependent
// field distinguishes is rendered once and shared by every node; eligible
// counts the endpoints allowed from at least one node.
func (w *world) renderVersions(md *modeData, or oracle.Oracle) error {
	nn := len(w.nodes)
	md.at = make([]int32, len(w.gvs))
	md.dep = make([]bool, len(w.gvs))
	size := 0
	for g := range w.gvs {
		md.at[g], md.dep[g] = int32(size), w.gvs[g].nodeDep
		size++
		if md.dep[g] {
			size += nn - 1
		}
	}
	md.rules = make([]*engine.Rules, size)
	md.out = make([]int32, size)
	md.eligible = make([]int, len(w.gvs))
	var store rulesBlock
	for g := range w.gvs {
		gi := &w.gvs[g]
		sv := &w.svcs[gi.svc]
		words := (len(sv.eps) + 63) / 64
		union := make([]uint64, words)
		var seen map[string]int // node-dependent: node view → first node with it
		if gi.nodeDep {
			seen = map[string]int{}
		}
		for ni, nd := range w.nodes {
			k := md.slot(g, ni)
			if !gi.nodeDep && ni > 0 {
				break // one entry serves every node
			}
			if gi.nodeDep {
				key := nodeView(gi.eps, nd)
				if first, ok := seen[key]; ok {
					md.rules[k], md.out[k] = md.ruleAt(g, first), md.outAt(g, first)
					continue
				}
				seen[key] = ni
			}
			r, exp := renderEntry(md, or, gi, sv, nd)
			oc, err := compactOutcome(exp, sv, words)
			if err != nil {
				return err
			}
			for i := range union {
				union[i] |= oc.allowed[i]
			}
			md.outs = append(md.outs, oc)
			md.rules[k], md.out[k] = store.put(r), int32(len(md.outs)-1)
		}
		for _, x := range union {
			md.eligible[g] += popcount(x)
		}
	}
	md.fastOutcomes(w)
	return nil
}

// rulesBlock hands out Rules from blocks of 4096, so that a mode's
// rendered rules lie in render order, the order in which a node run
// programs them, instead of one allocation each (a cache miss each when a
// node run copies them into its engines).
type rulesBlock []engine.Rules

func (b *rulesBlock) put(r engine.Rules) *engine.Rules {
	if len(*b) == 0 {
		*b = make([]engine.Rules, 4096)
	}
	p := &(*b)[0]
	*p = r
	*b = (*b)[1:]
	return p
}

// fastOutcomes fills md.fast, every slot's outcome in the form the
// per-connection path reads, once per mode: each node run copies its
// column instead of visiting every outcome.
func (md *modeData) fastOutcomes(w *world) {
	md.fast = make([]fastOutcome, len(md.out))
	for k, oi := range md.out {
		o := &md.outs[oi]
		md.fast[k] = fastOutcome{kind: o.kind, o: o, lost: o.lost}
		if len(o.allowed) == 1 {
			md.fast[k].bits, md.fast[k].small = o.allowed[0], true
		}
	}
	for g := range w.gvs {
		n := 1
		if md.dep[g] {
			n = len(w.nodes)
		}
		for k := md.at[g]; k < md.at[g]+int32(n); k++ {
			md.fast[k].cellOff = w.gvs[g].cellOff
		}
	}
}

// nodeView is what rendering and the oracle see of a node for a version's
// endpoints: its zone, and which endpoints are on it or hinted to it. They
// read the node's name only by comparing it with those fields (the
// categorizer's and the oracle's local and topology sets), and neither the
// rules nor the compact outcome keep a text naming the node, so nodes with
// the same view get the same rules and outcome: rendered once, shared. At
// 30,000 Services with 5% internalTrafficPolicy Local over 100 nodes this
// is 450,000 renders and oracle calls fewer, and their memory.
func nodeView(eps []*cluster.Endpoint, nd nodeInfo) string {
	b := make([]byte, 0, len(nd.zone)+1+(2*len(eps)+7)/8)
	b = append(b, nd.zone...)
	b = append(b, 0)
	var acc byte
	for i, e := range eps {
		bit := 2 * (i % 4)
		if e.NodeName == nd.name {
			acc |= 1 << bit
		}
		if slices.Contains(e.NodeHints, nd.name) {
			acc |= 2 << bit
		}
		if i%4 == 3 || i == len(eps)-1 {
			b = append(b, acc)
			acc = 0
		}
	}
	return string(b)
}

// renderEntry renders one version of an entry on one node and asks the
// oracle what it must do, for a client standing where the entry's clients
// stand: a pod, through the cluster IP (engine.Render, oracle.Expect), or a
// machine outside the cluster entering at the node through a node port,
// external IP or load-balancer IP (engine.RenderExternal, oracle.ExpectFrom
// from outside; the client's address is left unset: sim run takes every
// external client to be inside loadBalancerSourceRanges).
func renderEntry(md *modeData, or oracle.Oracle, gi *gvInfo, sv *svcInfo, nd nodeInfo) (engine.Rules, oracle.Outcome) {
	if !sv.via.External() {
		return engine.Render(md.mode, gi.sp, gi.eps, nd.name, nd.zone, sv.ids, engine.RenderOptions{}), or.Expect(md.name, gi.sp, gi.eps, nd.name, nd.zone)
	}
	from := cluster.Standpoint{Where: cluster.Outside, Node: nd.name}
	return engine.RenderExternal(md.mode, gi.sp, gi.eps, nd.name, nd.zone, sv.ids, engine.RenderOptions{}), or.ExpectFrom(md.name, gi.sp, gi.eps, from, sv.via, nd.zone)
}

// compactOutcome is the oracle's verdict for one version on one node, with
// the allowed endpoints as a bitset over the service's local endpoint IDs.
// An endpoint the oracle names that the state does not have is an error.
func compactOutcome(exp oracle.Outcome, sv *svcInfo, words int) (outcome, error) {
	oc := outcome{kind: exp.Kind, allowed: make([]uint64, words), devs: exp.Deviations, lost: exp.RepliesLost}
	for key := range exp.Probs {
		id, ok := sv.index[key]
		if !ok {
			return outcome{}, fmt.Errorf("the oracle named endpoint %s of %s, which the state does not have", key, sv.label)
		}
		oc.allowed[id>>6] |= 1 << (uint(id) & 63)
		oc.n++
	}
	return oc, nil
}

// calibration picks the sync-time calibration for the mode: the one for the
// scenario's variant of the mode, else the first for the mode, else none
// (ok false). It records the choice in md for the report.
func (w *world) calibration(md *modeData, o Options) (cal cost.Calibration, ok bool) {
	p := w.sc.Proxy
	variant := ""
	switch md.mode {
	case engine.IPTables:
		variant = p.IPTablesBackend
		if variant == "" {
			variant = "nft"
		}
	case engine.NFTables:
		variant = p.NFTablesLayout
		if variant == "" {
			variant = "kube-proxy"
		}
	case engine.IPVS:
		variant = IPVSVariant
	}
	cal, ok = cost.Find(w.cals, md.name, variant)
	if !ok {
		for _, c := range w.cals {
			if c.Mode == md.name {
				cal, ok = c, true
				break
			}
		}
	}
	if ok {
		md.variant = cal.Variant
	}
	switch {
	case o.SyncTime != nil:
		md.cal = "fixed by the caller (test)"
	case ok:
		md.cal = fmt.Sprintf("%s/%s: %s", cal.Mode, cal.Variant, cal.Source)
		if m, err := cost.NewModel(cal); err == nil {
			md.cal += fmt.Sprintf("; fitted %s (RMS error %.0f %%) to %d points at %d-%d Services", m.Fitted, 100*m.FitError, m.Points, m.MinServices, m.MaxServices)
			if m.Note != "" {
				md.cal += "; " + m.Note
			}
		}
	default:
		md.cal = "none: syncs are instant"
	}
	return cal, ok
}

func seconds(s float64) int64 {
	if !(s > 0) || math.IsInf(s, 0) {
		return 0
	}
	return int64(s * 1e9)
}

func popcount(x uint64) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// pickTimeline chooses the service port the timeline plot follows: the
// first flapping check's, else the one the most steps changed.
func (w *world) pickTimeline() {
	if len(w.steps) == 0 {
		return
	}
	for _, c := range w.sc.Checks {
		if c.Type != scenario.CheckFlapping {
			continue
		}
		if s, err := w.checkService(&c); err == nil {
			w.tlSvc = s
			break
		}
	}
	if w.tlSvc < 0 {
		best := 1
		for s := range w.svcs {
			if n := len(w.svcs[s].gvs); n > best {
				best, w.tlSvc = n, int32(s)
			}
		}
	}
	if w.tlSvc < 0 {
		return
	}
	// About 400 bins, at least 10 ms each.
	w.tlBin = max(int64(10*time.Millisecond), (w.tr.span/400+int64(time.Millisecond)-1)/int64(time.Millisecond)*int64(time.Millisecond))
	w.tlBins = int((w.tr.span + w.tlBin - 1) / w.tlBin)
}

// checkService finds the service port a check names (cluster.ResolvePort,
// the rule validation has already enforced), or -1 and why not.
func (w *world) checkService(c *scenario.Check) (int32, error) {
	n, err := cluster.ResolvePort(c.Service, c.Port, func(yield func(cluster.ServicePortName) bool) {
		for s := range w.nBase {
			if !yield(w.svcs[s].name) {
				return
			}
		}
	})
	if err != nil {
		return -1, err
	}
	s := w.svcByName[n]
	from, via := scenario.CheckRoute(c)
	if from != cluster.Outside {
		return s, nil
	}
	// A check of clients outside the cluster follows the external entry of
	// its destination.
	if v, ok := entryVia(w.gvs[w.svcs[s].gvs[0]].sp, via); ok {
		for _, x := range w.externalOf(s) {
			if w.svcs[x].via == v {
				return x, nil
			}
		}
	}
	return -1, fmt.Errorf("no client outside the cluster sends to %s through %s: give traffic a client with where: external and via: %s", w.svcs[s].label, via, via)
}

// oracleOutcome rebuilds the oracle's outcome from its compact form (the
// affinity tracker of the checks wants it).
func (w *world) oracleOutcome(s int32, o *outcome) oracle.Outcome {
	out := oracle.Outcome{Kind: o.kind, Deviations: o.devs}
	if o.kind != oracle.Endpoints {
		return out
	}
	out.Probs = make(map[string]float64, o.n)
	for id, name := range w.svcs[s].names {
		if o.allows(int32(id)) {
			out.Probs[name] = 1 / float64(o.n)
		}
	}
	return out
}
