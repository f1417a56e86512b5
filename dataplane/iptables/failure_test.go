package iptables

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/sim/cluster"
)

// failureCase is one way an apply can fail.
type failureCase struct {
	name    string
	command string
	ff      FakeFailure
	// ipsetCall is the ipset restore call of a sync to fail (1 creates the
	// sets, 2 destroys the stale ones); ipset affinity only.
	ipsetCall int
}

var failureCases = []failureCase{
	{name: "restore-before-commit", command: CommandRestore},
	{name: "restore-nat-after-filter", command: CommandRestore, ff: FakeFailure{Table: "nat"}},
	{name: "restore-after-commit", command: CommandRestore, ff: FakeFailure{Applied: true}},
	{name: "ipset-create", command: CommandIPSetRestore, ipsetCall: 1},
	{name: "ipset-create-after-apply", command: CommandIPSetRestore, ipsetCall: 1, ff: FakeFailure{Applied: true}},
	{name: "ipset-destroy", command: CommandIPSetRestore, ipsetCall: 2},
	{name: "ipset-destroy-after-apply", command: CommandIPSetRestore, ipsetCall: 2, ff: FakeFailure{Applied: true}},
}

// inject arms c to fail the next sync as fc says.
func (fc failureCase) inject(c *FakeCommands) {
	ff := fc.ff
	ff.Command = fc.command
	if fc.command == CommandRestore {
		ff.Call = c.Restores + 1
	} else {
		ff.Call = c.IPSetRestores + fc.ipsetCall
	}
	c.Failures = append(c.Failures, ff)
}

// requireFresh fails unless the fake holds exactly what a full sync of st
// on a fresh fake gives.
func requireFresh(t *testing.T, cfg Config, f *Fake, st *cluster.State, what string) {
	t.Helper()
	fresh, _, _ := load(t, cfg, st)
	if d := lineDiff(fresh.Dump(), f.Dump()); d != "" {
		t.Fatalf("%s: tables differ from a fresh sync (-fresh +got):\n%s", what, d)
	}
	if d := lineDiff(fresh.DumpIPSets(), f.DumpIPSets()); d != "" {
		t.Fatalf("%s: ipsets differ from a fresh sync (-fresh +got):\n%s", what, d)
	}
}

// failureTestState is a random state (render_cache_test.go's generator)
// plus a Service with ClientIP affinity and three endpoints, which the
// change to B deletes, so that B has stale chains and sets in either
// affinity mode.
func failureTestState(rng *rand.Rand) *cluster.State {
	st := cacheTestState(rng, 30)
	sp := clusterIPPort(name("aff", "svc", "p80"), "172.30.9.1", 80)
	sp.ClientIPAffinity, sp.AffinityTimeout = true, 10800
	add(st, sp, ep("10.9.0.1", 80, thisNode, "R"), ep("10.9.0.2", 80, otherNode, "R"), ep("10.9.0.3", 80, otherNode, "R"))
	return st
}

// failureTestChange changes st at random, deletes the affinity Service if
// it is there and adds a new one (so that the partial sync creates sets),
// and returns the changed service ports.
func failureTestChange(rng *rand.Rand, st *cluster.State, step int) []cluster.ServicePortName {
	changed := cacheTestMutate(rng, st)
	changed = append(changed, cacheTestMutate(rng, st)...)
	old := name("aff", "svc", "p80")
	delete(st.Services, old)
	delete(st.Endpoints, old)
	n := name("aff", fmt.Sprintf("new%d", step), "p80")
	sp := clusterIPPort(n, netip.AddrFrom4([4]byte{172, 30, 10, byte(step)}).String(), 80)
	sp.ClientIPAffinity, sp.AffinityTimeout = true, 60
	add(st, sp, ep(netip.AddrFrom4([4]byte{10, 10, byte(step), 1}).String(), 80, otherNode, "R"))
	return append(changed, old, n)
}

// TestFailedSyncLeavesNothingStale: sync state A, make the sync of B (some
// Services and endpoints removed, others added) fail in each way an apply
// can fail, sync again fully (as the Syncer does after a failure), and the
// tables and sets are exactly a fresh sync's: of B, and of a state C that
// differs from B. Several seeds of random changes, both affinity modes.
func TestFailedSyncLeavesNothingStale(t *testing.T) {
	for _, mode := range []AffinityMode{AffinityRecent, AffinityIPSet} {
		for _, fc := range failureCases {
			if fc.command == CommandIPSetRestore && mode != AffinityIPSet {
				continue
			}
			for _, next := range []string{"B", "C"} {
				t.Run(fmt.Sprintf("%s/%s/then-%s", mode, fc.name, next), func(t *testing.T) {
					for seed := uint64(1); seed <= 5; seed++ {
						cfg := testConfig()
						cfg.Affinity = mode
						cfg.LargeClusterThreshold = -1
						rng := rand.New(rand.NewPCG(seed, 10))
						st := failureTestState(rng)
						b, c := newBackend(t, cfg)
						apply(t, b, st, nil, true)

						changed := failureTestChange(rng, st, 1)
						fc.inject(c)
						if _, err := b.Sync(st, changed, false); !errors.Is(err, ErrInjected) {
							t.Fatalf("seed %d: sync of B returned %v, want the injected failure", seed, err)
						}
						if next == "C" {
							failureTestChange(rng, st, 2)
						}
						rs := apply(t, b, st, nil, true)
						if !rs.Full {
							t.Fatalf("seed %d: the sync after a failure is not full", seed)
						}
						requireFresh(t, cfg, c.Fake, st, fmt.Sprintf("seed %d, after the failure", seed))
						// And the Backend is back to partial syncs that
						// stay exact.
						changed = failureTestChange(rng, st, 3)
						if rs = apply(t, b, st, changed, false); rs.Full {
							t.Fatalf("seed %d: no partial sync after recovery", seed)
						}
						requireFresh(t, cfg, c.Fake, st, fmt.Sprintf("seed %d, partial sync after recovery", seed))
					}
				})
			}
		}
	}
}

// TestFailedFirstSync: the first sync, which also appends the jumps from the
// built-in chains, fails; the next one leaves each jump exactly once.
func TestFailedFirstSync(t *testing.T) {
	for _, fc := range failureCases[:3] {
		t.Run(fc.name, func(t *testing.T) {
			cfg := testConfig()
			st := overallState()
			b, c := newBackend(t, cfg)
			fc.inject(c)
			if _, err := b.Sync(st, nil, true); !errors.Is(err, ErrInjected) {
				t.Fatalf("first sync returned %v, want the injected failure", err)
			}
			apply(t, b, st, nil, true)
			requireFresh(t, cfg, c.Fake, st, "after a failed first sync")
		})
	}
}

// TestRandomFailuresConverge: random changes, each sync failing in a random
// way half of the time, several failures in a row included; after every
// successful sync the tables and sets are a fresh sync's.
func TestRandomFailuresConverge(t *testing.T) {
	for _, mode := range []AffinityMode{AffinityRecent, AffinityIPSet} {
		t.Run(string(mode), func(t *testing.T) {
			cfg := testConfig()
			cfg.Affinity = mode
			cfg.LargeClusterThreshold = -1
			rng := rand.New(rand.NewPCG(3, 30))
			st := failureTestState(rng)
			b, c := newBackend(t, cfg)
			needFull, failures := true, 0
			var pending []cluster.ServicePortName
			for step := 1; step <= 60; step++ {
				pending = append(pending, failureTestChange(rng, st, step)...)
				inject := rng.IntN(2) == 0
				if inject {
					fc := failureCases[rng.IntN(len(failureCases))]
					if fc.command == CommandIPSetRestore && mode != AffinityIPSet {
						fc = failureCases[rng.IntN(3)]
					}
					fc.inject(c)
				}
				_, err := b.Sync(st, pending, needFull)
				// A failure whose call did not come (no stale sets to
				// destroy) must not fire in a later sync.
				c.Failures = nil
				if err != nil && !errors.Is(err, ErrInjected) {
					t.Fatalf("step %d: %v", step, err)
				}
				if err != nil {
					failures++
					needFull = true
					continue
				}
				needFull, pending = false, nil
				requireFresh(t, cfg, c.Fake, st, fmt.Sprintf("step %d", step))
			}
			if failures < 10 {
				t.Fatalf("only %d of 60 syncs failed", failures)
			}
		})
	}
}

// syncerObjects are the API objects of n Services (ns/svc-i, port http) of
// three endpoints each, but for the names in skip, and with the first
// endpoint of svc-trim left out.
func syncerObjects(n int, skip map[int]bool, trim int) (map[types.NamespacedName]*corev1.Service, map[types.NamespacedName]*discoveryv1.EndpointSlice) {
	svcs := map[types.NamespacedName]*corev1.Service{}
	slices := map[types.NamespacedName]*discoveryv1.EndpointSlice{}
	for i := range n {
		if skip[i] {
			continue
		}
		key := types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i)}
		svcs[key] = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: fmt.Sprintf("172.30.0.%d", i+1),
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}}}
		port, proto, pn, ready := int32(8080), corev1.ProtocolTCP, "http", true
		var eps []discoveryv1.Endpoint
		for j := range 3 {
			if i == trim && j == 0 {
				continue
			}
			node := otherNode
			eps = append(eps, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.1.%d.%d", i, j+1)}, NodeName: &node,
				Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
		}
		slices[key] = &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name + "-x",
			Labels: map[string]string{discoveryv1.LabelServiceName: key.Name}},
			AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: &pn, Port: &port, Protocol: &proto}}, Endpoints: eps}
	}
	return svcs, slices
}

func feed(tr *cluster.Tracker, svcs map[types.NamespacedName]*corev1.Service, slices map[types.NamespacedName]*discoveryv1.EndpointSlice) {
	for k, s := range svcs {
		tr.OnService(k, s)
	}
	for k, s := range slices {
		tr.OnEndpointSlice(k.Namespace, k.Name+"-x", s, k.Name)
	}
}

// TestSyncerRecoversFromFailure: the Syncer over the real Backend on
// FakeCommands: a partial sync that removes two Services and an endpoint
// and adds a Service fails in nat; the Syncer's next sync (full, as after
// every failure) leaves the tables of a fresh sync of the same API state.
func TestSyncerRecoversFromFailure(t *testing.T) {
	cfg := testConfig()
	b, c := newBackend(t, cfg)
	tr := cluster.NewTracker()
	tr.OnNode(thisNode, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: thisNode}})
	svcs, slices := syncerObjects(10, nil, -1)
	feed(tr, svcs, slices)
	s := dataplane.NewSyncer(dataplane.SyncConfig{SyncPeriod: time.Hour}, b, tr, nil)
	if err := s.SyncOnce(); err != nil {
		t.Fatal(err)
	}
	// B: svc-2 and svc-3 deleted, svc-5 loses an endpoint, svc-10 is new.
	newSvcs, newSlices := syncerObjects(11, map[int]bool{2: true, 3: true}, 5)
	for _, i := range []int{2, 3} {
		k := types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i)}
		tr.OnService(k, nil)
		tr.OnEndpointSlice(k.Namespace, k.Name+"-x", nil, k.Name)
	}
	feed(tr, newSvcs, newSlices)
	c.Fail(CommandRestore, FakeFailure{Table: "nat"})
	if err := s.SyncOnce(); !errors.Is(err, ErrInjected) {
		t.Fatalf("sync of B returned %v, want the injected failure", err)
	}
	if err := s.SyncOnce(); err != nil {
		t.Fatal(err)
	}
	if !b.LastRuleset.Full {
		t.Error("the Syncer's sync after a failure was not full")
	}
	ref := cluster.NewTracker()
	ref.OnNode(thisNode, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: thisNode}})
	feed(ref, newSvcs, newSlices)
	st, _ := ref.Drain()
	requireFresh(t, cfg, c.Fake, st, "after the Syncer's recovery")
}
