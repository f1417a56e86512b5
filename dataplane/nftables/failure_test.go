package nftables

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/sim/cluster"
)

var errInjected = errors.New("injected failure")

// The failures injectingFake injects.
var nftFailures = []string{
	"rejected",     // nft reports an error: the kernel took nothing
	"killed",       // nft times out before the kernel takes the batch
	"killed-after", // nft times out after the kernel took the batch
}

// injectingFake fails its next Run as failure says (one of nftFailures).
type injectingFake struct {
	*knftables.Fake
	failure string
}

func (f *injectingFake) Run(ctx context.Context, tx *knftables.Transaction) error {
	failure := f.failure
	f.failure = ""
	timeout := fmt.Errorf("%w: %w", errInjected, context.DeadlineExceeded)
	switch failure {
	case "rejected":
		return errInjected
	case "killed":
		return timeout
	case "killed-after":
		if err := f.Fake.Run(ctx, tx); err != nil {
			return err
		}
		return timeout
	case "applied": // the kernel took the batch, nft reports an error
		if err := f.Fake.Run(ctx, tx); err != nil {
			return err
		}
		return errInjected
	}
	return f.Fake.Run(ctx, tx)
}

// failureChange changes st at random (mutate, three times), removes the
// first service port and adds a new one, and names what changed.
func failureChange(rng *rand.Rand, st *cluster.State, step int) []cluster.ServicePortName {
	var changed []cluster.ServicePortName
	for range 3 {
		changed = append(changed, mutate(rng, st)...)
	}
	if names := st.SortedServicePorts(); len(names) > 0 {
		delete(st.Services, names[0])
		delete(st.Endpoints, names[0])
		changed = append(changed, names[0])
	}
	n := name("fail", fmt.Sprintf("s%d", step), "p")
	sp := clusterIPPort(n, fmt.Sprintf("172.30.3.%d", step), 80)
	sp.ClientIPAffinity, sp.AffinityTimeout = true, 60
	add(st, sp, ep(fmt.Sprintf("10.184.0.%d", step), 80, otherNode, "R"))
	return append(changed, n)
}

// TestFailedSyncLeavesNothingStale: sync state A, make the transaction of B
// (service ports and endpoints removed and added) fail, sync again fully (as
// the Syncer does after a failure), and the table is a fresh sync's, of B or
// of a state C that differs from B. Several seeds, both layouts, each kind
// of failure (nft's error, and a timeout before or after the kernel took the
// batch).
func TestFailedSyncLeavesNothingStale(t *testing.T) {
	for _, layout := range layouts {
		for _, failure := range nftFailures {
			for _, next := range []string{"B", "C"} {
				t.Run(fmt.Sprintf("%s/%s/then-%s", layout, failure, next), func(t *testing.T) {
					for seed := uint64(1); seed <= 5; seed++ {
						rng := rand.New(rand.NewPCG(seed, 20))
						st := overallState()
						for range 5 {
							mutate(rng, st)
						}
						f := &injectingFake{Fake: knftables.NewFake(knftables.IPv4Family, DefaultTable)}
						b, err := NewBackend(testConfig(layout), f, BackendOptions{})
						if err != nil {
							t.Fatal(err)
						}
						b.r.now = steppingClock()
						if _, err := b.Sync(st, nil, true); err != nil {
							t.Fatal(err)
						}
						changed := failureChange(rng, st, 1)
						f.failure = failure
						if _, err := b.Sync(st, changed, false); !errors.Is(err, errInjected) {
							t.Fatalf("seed %d: sync of B returned %v, want the injected failure", seed, err)
						}
						if next == "C" {
							failureChange(rng, st, 2)
						}
						res, err := b.Sync(st, nil, true)
						if err != nil || !res.Full {
							t.Fatalf("seed %d: sync after the failure: %+v, %v", seed, res, err)
						}
						_, fresh := load(t, testConfig(layout), st)
						if got, want := sortedDump(withoutStale(f.Dump())), sortedDump(fresh.Dump()); got != want {
							t.Fatalf("seed %d: table differs from a fresh sync (-fresh +got):\n%s", seed, lineDiff(want, got))
						}
						// The next render deletes the stale chains.
						if _, err := b.Sync(st, nil, false); err != nil {
							t.Fatalf("seed %d: sync after the recovery: %v", seed, err)
						}
						if got, want := sortedDump(f.Dump()), sortedDump(fresh.Dump()); got != want {
							t.Fatalf("seed %d: after one more sync, table differs from a fresh sync (-fresh +got):\n%s", seed, lineDiff(want, got))
						}
					}
				})
			}
		}
	}
}

// TestFailuresInARow: nft reports an error although the kernel took the
// batch (nothing the kernel does today, but nothing forbids it). Here the
// batch deleted the stale chains an earlier sync left (kube-proxy layout:
// flushed in one sync, deleted in the next), so the full sync over the
// committed state fails too (it deletes them again, and the kernel no
// longer has them), and the sync after that recreates the table and leaves
// a fresh sync's table instead of failing for ever.
func TestFailuresInARow(t *testing.T) {
	const layout = LayoutKubeProxy
	rng := rand.New(rand.NewPCG(1, 20))
	st := overallState()
	for range 5 {
		mutate(rng, st)
	}
	f := &injectingFake{Fake: knftables.NewFake(knftables.IPv4Family, DefaultTable)}
	b, err := NewBackend(testConfig(layout), f, BackendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.r.now = steppingClock()
	if _, err := b.Sync(st, nil, true); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sync(st, failureChange(rng, st, 1), false); err != nil {
		t.Fatal(err)
	}
	changed := failureChange(rng, st, 2)
	f.failure = "applied"
	if _, err := b.Sync(st, changed, false); !errors.Is(err, errInjected) {
		t.Fatalf("sync of B returned %v, want the injected failure", err)
	}
	if _, err := b.Sync(st, nil, true); err == nil || errors.Is(err, errInjected) {
		t.Fatalf("full sync over the stale committed state returned %v, want the kernel's refusal", err)
	}
	res, err := b.Sync(st, nil, true)
	if err != nil || !res.Full {
		t.Fatalf("sync after two failures: %+v, %v", res, err)
	}
	if _, fresh := load(t, testConfig(layout), st); sortedDump(f.Dump()) != sortedDump(fresh.Dump()) {
		t.Fatalf("table differs from a fresh sync:\n%s", lineDiff(sortedDump(fresh.Dump()), sortedDump(f.Dump())))
	}
}
