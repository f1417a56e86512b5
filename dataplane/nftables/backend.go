package nftables

import (
	"context"
	"errors"
	"fmt"
	gosync "sync" // renamed: the tests of this package have a helper named sync
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Backend applies a Renderer's transactions through a knftables.Interface:
// knftables.New(knftables.IPv4Family, table) run inside the node's
// namespace, or a knftables.Fake. It implements dataplane.Backend.
//
// A failed transaction is one of two kinds. nft reported an error: the
// kernel runs a transaction as one batch and rejected all of it, so it holds
// what was last committed, the renderer keeps that (Renderer.Abort) and the
// next sync is a full one over it, which keeps the clients in the affinity
// sets. nft was killed or timed out: the kernel may have taken the batch or
// not, so the next sync recreates the table (Renderer.Reset; add, delete
// and add the table in one transaction), whatever it holds. A full sync that
// fails after a failure also recreates the table next time, so that a kernel
// that diverged from the committed state in a way that makes the full sync
// fail recovers too.
type Backend struct {
	// mu serialises the methods: the sync loop calls Sync while the
	// conformance checks read Counters (the renderer's records).
	mu  gosync.Mutex
	r   *Renderer
	nft knftables.Interface
	opt BackendOptions
	// failed reports a failed sync since the last successful one.
	failed bool
	// size is the table's size in operations, for the bound of a listing
	// or a deletion: the last full sync's operations plus those of the
	// partial syncs since (an upper bound).
	size int
}

// BackendOptions are the Backend's hooks to read the kernel's table back;
// both may be nil with a knftables.Fake.
type BackendOptions struct {
	// ListText returns `nft list table ip <table>` (Dump). Nil: the
	// Fake's Dump, or an error with a real Interface.
	ListText func(ctx context.Context) (string, error)
	// ListJSON returns `nft -j list table ip <table>` (Counters). Nil:
	// with a Fake, the counters of the Fake's dump (all zero); with a real
	// Interface, an error.
	ListJSON func(ctx context.Context) ([]byte, error)
	// Timeout bounds each nft call (TimeoutFlag); 0: the size-derived
	// bound, CallBound.
	Timeout time.Duration
}

var _ dataplane.Backend = (*Backend)(nil)

// dumper is an Interface that can print its state, as knftables.Fake does.
type dumper interface{ Dump() string }

// NewBackend returns a backend for cfg's node over nft, whose family must
// be ip and whose table must be cfg.Table (default "kube-proxy").
func NewBackend(cfg Config, nft knftables.Interface, opt BackendOptions) (*Backend, error) {
	r, err := NewRenderer(cfg)
	if err != nil {
		return nil, err
	}
	if nft == nil {
		return nil, fmt.Errorf("could not create the nftables backend: no knftables interface")
	}
	r.txs = nft
	return &Backend{r: r, nft: nft, opt: opt}, nil
}

// Renderer returns the backend's renderer (for its configuration and refs).
func (b *Backend) Renderer() *Renderer { return b.r }

// Sync renders st and runs the transaction; on failure nothing is committed
// and the next sync is a full one.
func (b *Backend) Sync(st *cluster.State, changed []cluster.ServicePortName, full bool) (dataplane.SyncResult, error) {
	start := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	tx, stats, err := b.r.Render(st, changed, full)
	if err != nil {
		return dataplane.SyncResult{}, err
	}
	bound := CallBound(stats.Operations, b.opt.Timeout)
	ctx, cancel := context.WithTimeout(context.Background(), bound.Limit)
	defer cancel()
	if err := b.nft.Run(ctx, tx); err != nil {
		killed := ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
		if killed || (b.failed && stats.Full) {
			b.r.Reset()
		} else {
			b.r.Abort()
		}
		b.failed = true
		b.size = max(b.size, stats.Operations) // the kernel may hold it
		if err := timedOut(ctx, "transaction", bound, err); err != nil {
			return dataplane.SyncResult{}, err
		}
		return dataplane.SyncResult{}, fmt.Errorf("could not run the nftables transaction (%d operations): %w", stats.Operations, err)
	}
	b.r.Commit()
	b.failed = false
	if stats.Full {
		b.size = stats.Operations
	} else {
		b.size += stats.Operations
	}
	return dataplane.SyncResult{
		Full:             stats.Full,
		Duration:         time.Since(start),
		Bytes:            len(tx.String()),
		Lines:            stats.Operations,
		NoLocalEndpoints: stats.NoLocalEndpoints,
	}, nil
}

// Dump returns the table in nft syntax: the Fake's sorted dump, or
// ListText's output.
func (b *Backend) Dump() (string, error) {
	if b.opt.ListText != nil {
		b.mu.Lock()
		bound := CallBound(b.size, b.opt.Timeout)
		b.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), bound.Limit)
		defer cancel()
		s, err := b.opt.ListText(ctx)
		if err != nil {
			if err := timedOut(ctx, "listing of the table", bound, err); err != nil {
				return "", err
			}
			return "", fmt.Errorf("could not list the nftables table: %w", err)
		}
		return s, nil
	}
	if f, ok := b.nft.(dumper); ok {
		return f.Dump(), nil
	}
	return "", errors.New("could not dump the nftables table: no lister configured")
}

// Counters reads the per-endpoint and per-verdict counters and maps them to
// service ports and endpoints. The kube-proxy layout has no counters, as
// kube-proxy's table has none: nil (unavailable), no error.
func (b *Backend) Counters() ([]dataplane.Counter, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.r.cfg.Layout == LayoutKubeProxy {
		return nil, nil
	}
	refs := b.r.Refs()
	if b.opt.ListJSON != nil {
		bound := CallBound(b.size, b.opt.Timeout)
		ctx, cancel := context.WithTimeout(context.Background(), bound.Limit)
		defer cancel()
		data, err := b.opt.ListJSON(ctx)
		if err != nil {
			if err := timedOut(ctx, "listing of the table", bound, err); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("could not list the nftables table: %w", err)
		}
		return ParseCountersJSON(data, refs)
	}
	if f, ok := b.nft.(dumper); ok {
		return ParseCountersDump(f.Dump(), refs), nil
	}
	return nil, errors.New("could not read nftables counters: no lister configured")
}

// Cleanup deletes the table (a missing one is fine) and forgets it.
func (b *Backend) Cleanup() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	tx := b.nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	bound := CallBound(b.size, b.opt.Timeout)
	ctx, cancel := context.WithTimeout(context.Background(), bound.Limit)
	defer cancel()
	err := b.nft.Run(ctx, tx)
	b.r.Reset()
	if err != nil && !isNotFound(err) {
		if err := timedOut(ctx, "deletion of the table", bound, err); err != nil {
			return err
		}
		return fmt.Errorf("could not delete the nftables table: %w", err)
	}
	b.size = 0
	return nil
}

// timedOut returns a TimeoutError if the call failed with err because ctx
// reached its bound, else nil.
func timedOut(ctx context.Context, call string, bound Bound, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return &TimeoutError{Call: call, Bound: bound, Err: err}
	}
	return nil
}

// RenderForNode returns the table one full sync would give node for st, in
// nft syntax (a knftables.Fake's sorted dump: objects first, then rules and
// elements): what `sim rules --mode nftables` prints.
func RenderForNode(st *cluster.State, node string, cfg Config) (string, error) {
	cfg.NodeName = node
	if err := cfg.defaults(); err != nil {
		return "", fmt.Errorf("could not configure the nftables renderer: %w", err)
	}
	f := knftables.NewFake(knftables.IPv4Family, cfg.Table)
	b, err := NewBackend(cfg, f, BackendOptions{})
	if err != nil {
		return "", err
	}
	if _, err := b.Sync(st, nil, true); err != nil {
		return "", fmt.Errorf("could not render the nftables rules of node %s: %w", node, err)
	}
	return f.Dump(), nil
}
