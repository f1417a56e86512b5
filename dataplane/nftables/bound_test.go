package nftables

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"
)

func TestCallBound(t *testing.T) {
	for _, c := range []struct {
		ops   int
		fixed time.Duration
		want  time.Duration
		how   string
	}{
		{0, 0, 30 * time.Second, "max(30s, 0 operations x 5ms per operation)"},
		{-1, 0, 30 * time.Second, "max(30s, -1 operations x 5ms per operation)"},
		{5999, 0, 30 * time.Second, "max(30s, 5999 operations x 5ms per operation)"},
		{6001, 0, 30005 * time.Millisecond, "max(30s, 6001 operations x 5ms per operation)"},
		// The v1.31 layout's 5000 x 10 full sync, killed at 30 s by the
		// fixed bound after 31 s; it took 82 s in the kernel.
		{175047, 0, 875235 * time.Millisecond, "max(30s, 175047 operations x 5ms per operation)"},
		{175047, 10 * time.Minute, 10 * time.Minute, "--nft-timeout 10m0s"},
		{3, time.Millisecond, time.Millisecond, "--nft-timeout 1ms"},
	} {
		b := CallBound(c.ops, c.fixed)
		if b.Limit != c.want || b.Derivation() != c.how || b.Operations != c.ops || b.Fixed != (c.fixed > 0) {
			t.Errorf("CallBound(%d, %s) = %+v (%s), want %s (%s)", c.ops, c.fixed, b, b.Derivation(), c.want, c.how)
		}
	}
}

func TestTimeoutErrorMessage(t *testing.T) {
	e := &TimeoutError{Call: "transaction", Bound: CallBound(175047, 0), Err: errors.New("signal: killed")}
	want := "the nft transaction (175047 operations) was still running when it reached its bound of 14m35.235s, so it was stopped (signal: killed); " +
		"the bound is max(30s, 175047 operations x 5ms per operation). A slow nft call is a measurement, not a dataplane error: " +
		"to let it finish, raise the bound with --nft-timeout DUR (for example --nft-timeout 59m0s)"
	if got := e.Error(); got != want {
		t.Errorf("message:\n got %s\nwant %s", got, want)
	}
	if !errors.Is(e, e.Err) {
		t.Error("TimeoutError does not unwrap to nft's error")
	}
}

// deadlineFake records the deadline of each Run; with stall it waits for
// the context's end and fails as a killed nft does.
type deadlineFake struct {
	*knftables.Fake
	deadlines []time.Time
	stall     bool
	// discard drops the transactions instead of running them into the
	// Fake (whose run is quadratic in a map's size).
	discard bool
}

func (f *deadlineFake) Run(ctx context.Context, tx *knftables.Transaction) error {
	d, _ := ctx.Deadline()
	f.deadlines = append(f.deadlines, d)
	if f.stall {
		<-ctx.Done()
		return errors.New("signal: killed")
	}
	if f.discard {
		return nil
	}
	return f.Fake.Run(ctx, tx)
}

// TestSyncBoundedBySize: each transaction's deadline is CallBound of its
// operations from the moment it started (bracketed by clock readings around
// Sync, so no timing is asserted).
func TestSyncBoundedBySize(t *testing.T) {
	f := &deadlineFake{Fake: knftables.NewFake(knftables.IPv4Family, DefaultTable), discard: true}
	b, err := NewBackend(testConfig(LayoutKubeProxy), f, BackendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := bigState(2000, 1) // a full sync of more than 6 000 operations
	before := time.Now()
	res, err := b.Sync(st, nil, true)
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	lim := CallBound(res.Lines, 0).Limit
	if lim <= BoundFloor {
		t.Fatalf("%d operations: bound %s, want one above the floor for this test", res.Lines, lim)
	}
	if d := f.deadlines[0]; d.Before(before.Add(lim)) || d.After(after.Add(lim)) {
		t.Errorf("deadline %s after the start, want %s (CallBound of %d operations)", d.Sub(before), lim, res.Lines)
	}
	before = time.Now()
	if err := b.Cleanup(); err != nil { // the table's size bounds its deletion
		t.Fatal(err)
	}
	if d := f.deadlines[1]; d.Before(before.Add(lim)) || d.After(time.Now().Add(lim)) {
		t.Errorf("deletion of a table of %d operations: deadline %s after the start, want %s", res.Lines, d.Sub(before), lim)
	}
}

// TestSyncTimeoutSaysWhatHappened: a transaction stopped at its bound
// (--nft-timeout 1ms, nft stalled) returns a TimeoutError naming the call,
// its operations, the bound and the flag, and the next sync recreates the
// table.
func TestSyncTimeoutSaysWhatHappened(t *testing.T) {
	f := &deadlineFake{Fake: knftables.NewFake(knftables.IPv4Family, DefaultTable)}
	b, err := NewBackend(testConfig(LayoutKubeProxy), f, BackendOptions{Timeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	st := overallState()
	f.stall = true
	_, err = b.Sync(st, nil, true)
	var te *TimeoutError
	if !errors.As(err, &te) {
		t.Fatalf("sync returned %v, want a TimeoutError", err)
	}
	if te.Call != "transaction" || !te.Bound.Fixed || te.Bound.Limit != time.Millisecond || te.Bound.Operations == 0 {
		t.Errorf("TimeoutError %+v", te)
	}
	for _, s := range []string{"nft transaction", "operations", "bound of 1ms", "--nft-timeout 1ms", "raise the bound with --nft-timeout DUR", "signal: killed"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("message lacks %q: %s", s, err)
		}
	}
	f.stall = false
	b.opt.Timeout = 0
	if _, stats := sync(t, b, st, nil, true); !stats.First {
		t.Errorf("the sync after a timeout did not recreate the table: %+v", stats)
	}
}
