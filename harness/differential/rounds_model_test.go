package differential

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/sim/cluster"
)

// model is a proxy without a kernel: a tracker, our iptables renderer in
// large-cluster mode (a threshold of 1) with stale chains kept
// (StaleChainPeriod 1 h) and the
// behavioural fake of the tables it restores into. It stands in for
// kube-proxy to check the rounds rule: whatever the order and grouping of
// its syncs inside a round, the tables after the round are the same.
type model struct {
	t     *testing.T
	tr    *cluster.Tracker
	r     *iptables.Renderer
	fake  *iptables.Fake
	owner map[string]string // "ns/slice" -> service name
	first bool
}

func newModel(t *testing.T, gc GenConfig) *model {
	return newModelAt(t, gc, 1, 2)
}

// newModelAt is a model with a large-cluster threshold and a ballast of
// that many endpoints (0: none).
func newModelAt(t *testing.T, gc GenConfig, threshold, ballast int) *model {
	t.Helper()
	r, err := iptables.NewRenderer(iptables.Config{
		NodeConfig: dataplane.NodeConfig{
			NodeName: gc.Node, ClusterCIDR: gc.PodCIDR, ServiceCIDRs: []netip.Prefix{gc.ServiceCIDR}, PreferSameNode: true,
		},
		// Large from the first sync on with a ballast of 2 (the fake
		// clones its tables on every restore: 1,002 would take seconds).
		LargeClusterThreshold: threshold,
		StaleChainPeriod:      time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	m := &model{t: t, tr: cluster.NewTracker(), r: r, fake: iptables.NewFake(), owner: map[string]string{}, first: true}
	m.tr.OnNode(gc.Node, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: gc.Node, Labels: map[string]string{"topology.kubernetes.io/zone": gc.Zone}}})
	if ballast > 0 {
		svc, sls := Ballast(ballast, gc.ServiceCIDR, gc.PodCIDR)
		m.apply(writeSet{svcs: []*corev1.Service{svc}, slices: sls})
	}
	m.sync()
	return m
}

// apply feeds w's events to the tracker in order.
func (m *model) apply(w writeSet) {
	for _, s := range w.svcs {
		m.tr.OnService(types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, s)
	}
	for _, s := range w.slices {
		svc := s.Labels[discoveryv1.LabelServiceName]
		m.owner[s.Namespace+"/"+s.Name] = svc
		m.tr.OnEndpointSlice(s.Namespace, s.Name, s, svc)
	}
	for _, d := range w.delSvc {
		m.tr.OnService(d, nil)
	}
	for _, d := range w.delSl {
		m.tr.OnEndpointSlice(d.Namespace, d.Name, nil, m.owner[d.String()])
	}
}

// sync renders what changed and restores it into the fake.
func (m *model) sync() {
	m.t.Helper()
	st, ch := m.tr.Drain()
	rs, err := m.r.Render(st, ch.All(), m.first || ch.Nodes)
	if err != nil {
		m.t.Fatal(err)
	}
	if err := m.fake.Restore(rs.Restore); err != nil {
		m.t.Fatal(err)
	}
	if m.first {
		if err := m.fake.Restore(rs.Jumps); err != nil {
			m.t.Fatal(err)
		}
	}
	m.r.Commit(rs)
	m.first = false
}

// events splits w into single writes, in w's order or reversed.
func events(w writeSet, reverse bool) []writeSet {
	var out []writeSet
	for _, s := range w.svcs {
		out = append(out, writeSet{svcs: []*corev1.Service{s}})
	}
	for _, s := range w.slices {
		out = append(out, writeSet{slices: []*discoveryv1.EndpointSlice{s}})
	}
	for _, d := range w.delSvc {
		out = append(out, writeSet{delSvc: []types.NamespacedName{d}})
	}
	for _, d := range w.delSl {
		out = append(out, writeSet{delSl: []types.NamespacedName{d}})
	}
	if reverse {
		slices.Reverse(out)
	}
	return out
}

// TestRoundsModel runs the large regime's small scenarios through four models:
// a sync per round (ours in the comparison), a sync per event in two
// orders (kube-proxy without coalescing), and a sync per step. The first
// three must agree after every step; the per-step model must differ at
// least once (why rounds are needed).
func TestRoundsModel(t *testing.T) {
	gc := DefaultGenConfig()
	// The large regime's scenarios of at most 60 endpoints (the fake
	// clones its tables on every restore: hundreds of endpoints per
	// scenario would take tens of seconds).
	var batch []*Scenario
	mods := map[uint64]bool{}
	for _, b := range PlanRandom(1, RandomScenarios, gc)[1].Batches {
		for _, sc := range b {
			if sc.Peak() <= 60 && len(batch) < 120 && !mods[sc.Seed%MaxSeeds] {
				batch = append(batch, sc)
				mods[sc.Seed%MaxSeeds] = true
			}
		}
	}
	perRound, fwd, rev, perStep := newModel(t, gc), newModel(t, gc), newModel(t, gc), newModel(t, gc)
	live, owner := map[string]bool{}, map[string]string{}
	stepDiffers := 0
	for k := 0; ; k++ {
		var w writeSet
		for _, sc := range batch {
			if k < len(sc.Steps) {
				st := sc.Steps[k]
				w.add(writeSet{svcs: st.Services, slices: st.Slices, delSvc: st.DeleteServices, delSl: st.DeleteSlices})
			}
		}
		if w.empty() {
			break
		}
		w = withoutSCTP(w)
		for _, r := range rounds(w, live, owner) {
			perRound.apply(r)
			perRound.sync()
			for _, e := range events(r, false) {
				fwd.apply(e)
				fwd.sync()
			}
			for _, e := range events(r, true) {
				rev.apply(e)
				rev.sync()
			}
		}
		track(live, owner, w)
		perStep.apply(w)
		perStep.sync()
		want := perRound.fake.Dump()
		for name, m := range map[string]*model{"per event": fwd, "per event, reversed": rev} {
			if d := Diff(NormalizeIPTablesSave(want), NormalizeIPTablesSave(m.fake.Dump())); len(d) > 0 {
				t.Errorf("step %d: a sync per round and %s differ in %d lines; first: %v", k, name, len(d), d[:min(6, len(d))])
			}
		}
		if d := Diff(NormalizeIPTablesSave(want), NormalizeIPTablesSave(perStep.fake.Dump())); len(d) > 0 {
			stepDiffers++
		}
	}
	t.Logf("%d scenarios: a sync per step differs from a sync per round after %d steps", len(batch), stepDiffers)
	if stepDiffers == 0 {
		t.Error("a sync per step never differs from a sync per round: the batch does not exercise the rounds rule")
	}
}

// withoutSCTP copies w with SCTP ports made UDP: the fake does not model the
// sctp match, and the rounds rule does not depend on the protocol.
func withoutSCTP(w writeSet) writeSet {
	out := w
	out.svcs, out.slices = nil, nil
	for _, s := range w.svcs {
		s = s.DeepCopy()
		for i := range s.Spec.Ports {
			if s.Spec.Ports[i].Protocol == corev1.ProtocolSCTP {
				s.Spec.Ports[i].Protocol = corev1.ProtocolUDP
			}
		}
		out.svcs = append(out.svcs, s)
	}
	for _, s := range w.slices {
		s = s.DeepCopy()
		for i := range s.Ports {
			if p := s.Ports[i].Protocol; p != nil && *p == corev1.ProtocolSCTP {
				s.Ports[i].Protocol = ptr.To(corev1.ProtocolUDP)
			}
		}
		out.slices = append(out.slices, s)
	}
	return out
}

// TestSmallRegimeModel runs the small regime's first batches, cleanup
// included, through a model at kube-proxy's threshold synced per event and
// one synced per step: no state of a small batch is large and stale chains
// go at once, so the two agree after every step.
func TestSmallRegimeModel(t *testing.T) {
	gc := DefaultGenConfig()
	for _, batch := range PlanRandom(1, RandomScenarios, gc)[0].Batches[:2] {
		perEvent, perStep := newModelAt(t, gc, LargeClusterThreshold, 0), newModelAt(t, gc, LargeClusterThreshold, 0)
		live, owner := map[string]bool{}, map[string]string{}
		for k := 0; ; k++ {
			var w writeSet
			for _, sc := range batch {
				if k < len(sc.Steps) {
					st := sc.Steps[k]
					w.add(writeSet{svcs: st.Services, slices: st.Slices, delSvc: st.DeleteServices, delSl: st.DeleteSlices})
				}
			}
			last := w.empty()
			if last {
				w.delSvc, w.delSl = liveObjects(live)
			}
			w = withoutSCTP(w)
			for _, e := range events(w, false) {
				perEvent.apply(e)
				perEvent.sync()
			}
			track(live, owner, w)
			perStep.apply(w)
			perStep.sync()
			if d := Diff(NormalizeIPTablesSave(perEvent.fake.Dump()), NormalizeIPTablesSave(perStep.fake.Dump())); len(d) > 0 {
				t.Errorf("batch of seeds %d-%d, step %d: a sync per event and per step differ in %d lines; first: %v", batch[0].Seed, batch[len(batch)-1].Seed, k, len(d), d[:min(6, len(d))])
			}
			if last {
				break
			}
		}
	}
}
