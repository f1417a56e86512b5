package ipvs

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	libipvs "github.com/moby/ipvs"
	corev1 "k8s.io/api/core/v1"

	"github.com/kpsim/kpsim/sim/cluster"
)

var errInjected = errors.New("injected failure")

// failingIPVS is a Fake whose failAt-th table change fails (counting from
// the moment failAt is set; 0: none).
type failingIPVS struct {
	*Fake
	failAt, n int
}

func (f *failingIPVS) fail() error {
	if f.failAt == 0 {
		return nil
	}
	if f.n++; f.n == f.failAt {
		f.failAt, f.n = 0, 0
		return errInjected
	}
	return nil
}

func (f *failingIPVS) NewService(s *libipvs.Service) error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.Fake.NewService(s)
}

func (f *failingIPVS) UpdateService(s *libipvs.Service) error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.Fake.UpdateService(s)
}

func (f *failingIPVS) DelService(s *libipvs.Service) error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.Fake.DelService(s)
}

func (f *failingIPVS) NewDestination(s *libipvs.Service, d *libipvs.Destination) error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.Fake.NewDestination(s, d)
}

func (f *failingIPVS) UpdateDestination(s *libipvs.Service, d *libipvs.Destination) error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.Fake.UpdateDestination(s, d)
}

func (f *failingIPVS) DelDestination(s *libipvs.Service, d *libipvs.Destination) error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.Fake.DelDestination(s, d)
}

// partialRestoreSystem is a FakeSystem whose failNAT-th iptables-restore
// from now (0: none) commits the filter table and fails in nat, as
// iptables-legacy-restore can.
type partialRestoreSystem struct {
	*FakeSystem
	failNAT int
}

func (s *partialRestoreSystem) Run(stdin string, name string, args ...string) (string, error) {
	if s.failNAT == 0 || !strings.HasSuffix(name, "-restore") || !strings.HasPrefix(name, "iptables-") {
		return s.FakeSystem.Run(stdin, name, args...)
	}
	if s.failNAT--; s.failNAT > 0 {
		return s.FakeSystem.Run(stdin, name, args...)
	}
	filter, _, _ := strings.Cut(stdin, "*nat\n")
	if _, err := s.FakeSystem.Run(filter, name, args...); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s: table nat: %w", name, errInjected)
}

// ipvsFailures are the ways a sync fails: a table change part way through
// the virtual servers, the ipset restore, the iptables-restore, or the
// iptables-restore after its filter table committed.
var ipvsFailures = []string{"ipvs-1", "ipvs-3", "ipvs-6", "ipset", "iptables", "iptables-nat"}

type failingFakes struct {
	ipvs *failingIPVS
	sys  *partialRestoreSystem
	b    *Backend
}

func newFailingFakes(t *testing.T) *failingFakes {
	t.Helper()
	f := &failingIPVS{Fake: NewFake()}
	sys := &partialRestoreSystem{FakeSystem: NewFakeSystem(f.Fake)}
	b, err := New(testConfig(), f, sys)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return &failingFakes{ipvs: f, sys: sys, b: b}
}

func (f *failingFakes) inject(failure string) {
	switch failure {
	case "ipset":
		f.sys.Fail["ipset"] = errInjected
	case "iptables":
		f.sys.Fail[f.b.Tool("restore")] = errInjected
	case "iptables-nat":
		f.sys.failNAT = 1
	default:
		fmt.Sscanf(failure, "ipvs-%d", &f.ipvs.failAt)
	}
}

// requireFresh fails unless b's dump is a fresh backend's after one full
// sync of st.
func requireFresh(t *testing.T, b *Backend, st *cluster.State, what string) {
	t.Helper()
	g := newFakes(t, testConfig())
	g.sync(t, st, true)
	got, err := b.Dump()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(g.dump(t), got); d != "" {
		t.Fatalf("%s: state differs from a fresh sync (-fresh +got):\n%s", what, d)
	}
}

// randomState has n ClusterIP or NodePort Services with up to six
// endpoints each, some with affinity or a Local policy.
func randomState(rng *rand.Rand, n int) *cluster.State {
	st := newState()
	for i := range n {
		addRandom(rng, st, i)
	}
	return st
}

func addRandom(rng *rand.Rand, st *cluster.State, i int) cluster.ServicePortName {
	n := name(fmt.Sprintf("ns%d", i%3), fmt.Sprintf("svc%d", i), "p80")
	sp := clusterIPPort(n, netip.AddrFrom4([4]byte{172, 30, byte(i >> 8), byte(i)}).String(), 80)
	if rng.IntN(4) == 0 {
		sp.Type, sp.NodePort = corev1.ServiceTypeNodePort, int32(30000+i)
		sp.ExternalLocal = rng.IntN(2) == 0
	}
	sp.InternalLocal = rng.IntN(5) == 0
	sp.ClientIPAffinity, sp.AffinityTimeout = rng.IntN(3) == 0, 10800
	var eps []*cluster.Endpoint
	for j := range rng.IntN(7) {
		node := []string{thisNode, otherNode}[rng.IntN(2)]
		eps = append(eps, ep(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), byte(j + 1)}).String(), 8080, node, []string{"R", "R", "R", ""}[rng.IntN(4)]))
	}
	add(st, sp, eps...)
	return n
}

// change removes two Services and an endpoint of two more, adds two
// Services, an endpoint and flips an affinity, at random; it returns the
// changed service ports.
func change(rng *rand.Rand, st *cluster.State, step int) []cluster.ServicePortName {
	var changed []cluster.ServicePortName
	pick := func() cluster.ServicePortName {
		names := st.SortedServicePorts()
		return names[rng.IntN(len(names))]
	}
	for range 2 {
		n := pick()
		delete(st.Services, n)
		delete(st.Endpoints, n)
		changed = append(changed, n)
	}
	for range 2 {
		n := pick()
		if eps := st.Endpoints[n]; len(eps) > 0 {
			st.Endpoints[n] = eps[1:]
		}
		changed = append(changed, n)
	}
	for k := range 2 {
		changed = append(changed, addRandom(rng, st, 100*step+k))
	}
	n := pick()
	st.Endpoints[n] = append(st.Endpoints[n], ep(netip.AddrFrom4([4]byte{10, 200, byte(step), byte(rng.IntN(250) + 1)}).String(), 8080, thisNode, "R"))
	m := pick()
	sp := *st.Services[m]
	sp.ClientIPAffinity = !sp.ClientIPAffinity
	st.Services[m] = &sp
	return append(changed, n, m)
}

// TestFailedSyncLeavesNothingStale: sync state A, make the sync of B fail
// in each way it can, sync again fully (as the Syncer does after a
// failure), and the kernel state is exactly a fresh backend's, for B and
// for a state C that differs from B. Several seeds.
func TestFailedSyncLeavesNothingStale(t *testing.T) {
	for _, failure := range ipvsFailures {
		for _, next := range []string{"B", "C"} {
			t.Run(failure+"/then-"+next, func(t *testing.T) {
				for seed := uint64(1); seed <= 5; seed++ {
					rng := rand.New(rand.NewPCG(seed, 40))
					st := randomState(rng, 20)
					f := newFailingFakes(t)
					if _, err := f.b.Sync(st, nil, true); err != nil {
						t.Fatal(err)
					}
					changed := change(rng, st, 1)
					f.inject(failure)
					if _, err := f.b.Sync(st, changed, false); !errors.Is(err, errInjected) {
						t.Fatalf("seed %d: sync of B returned %v, want the injected failure", seed, err)
					}
					if next == "C" {
						change(rng, st, 2)
					}
					res, err := f.b.Sync(st, nil, true)
					if err != nil || !res.Full {
						t.Fatalf("seed %d: sync after the failure: %+v, %v", seed, res, err)
					}
					requireFresh(t, f.b, st, fmt.Sprintf("seed %d", seed))
				}
			})
		}
	}
}

// TestFailedFirstSync: the first sync fails in the jump rules' restore after
// its filter table committed; the next sync leaves each jump rule once.
func TestFailedFirstSync(t *testing.T) {
	st := overallState()
	f := newFailingFakes(t)
	f.sys.failNAT = 2 // the first restore is the rules', the second the jumps'
	if _, err := f.b.Sync(st, nil, true); !errors.Is(err, errInjected) {
		t.Fatalf("first sync returned %v, want the injected failure", err)
	}
	if _, err := f.b.Sync(st, nil, true); err != nil {
		t.Fatal(err)
	}
	requireFresh(t, f.b, st, "after a failed first sync")
}
