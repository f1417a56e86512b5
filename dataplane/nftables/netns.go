package nftables

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/dataplane/netns"
)

// nsNFT is a knftables.Interface whose every call runs inside a network
// namespace: knftables executes `nft`, and a child forked from a thread
// switched into the namespace (netns.Namespace.Do) lives there.
type nsNFT struct {
	ns    *netns.Namespace
	inner knftables.Interface
}

var _ knftables.Interface = (*nsNFT)(nil)

// NewInNamespace returns knftables for family/table that programs ns.
func NewInNamespace(ns *netns.Namespace, family knftables.Family, table string) (knftables.Interface, error) {
	var inner knftables.Interface
	err := ns.Do(func() (err error) {
		inner, err = knftables.New(family, table)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &nsNFT{ns: ns, inner: inner}, nil
}

func (n *nsNFT) NewTransaction() *knftables.Transaction { return n.inner.NewTransaction() }

func (n *nsNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	return n.ns.Do(func() error { return n.inner.Run(ctx, tx) })
}

func (n *nsNFT) Check(ctx context.Context, tx *knftables.Transaction) error {
	return n.ns.Do(func() error { return n.inner.Check(ctx, tx) })
}

func (n *nsNFT) ListAll(ctx context.Context) (out map[string][]string, err error) {
	err = n.ns.Do(func() (e error) { out, e = n.inner.ListAll(ctx); return })
	return
}

func (n *nsNFT) List(ctx context.Context, objectType string) (out []string, err error) {
	err = n.ns.Do(func() (e error) { out, e = n.inner.List(ctx, objectType); return })
	return
}

func (n *nsNFT) ListRules(ctx context.Context, chain string) (out []*knftables.Rule, err error) {
	err = n.ns.Do(func() (e error) { out, e = n.inner.ListRules(ctx, chain); return })
	return
}

func (n *nsNFT) ListElements(ctx context.Context, objectType, name string) (out []*knftables.Element, err error) {
	err = n.ns.Do(func() (e error) { out, e = n.inner.ListElements(ctx, objectType, name); return })
	return
}

func (n *nsNFT) ListCounters(ctx context.Context) (out []*knftables.Counter, err error) {
	err = n.ns.Do(func() (e error) { out, e = n.inner.ListCounters(ctx); return })
	return
}

// NewNamespaceBackend returns a Backend that programs cfg's table (family
// ip) inside ns with the system's nft, and reads it back with `nft list`.
// timeout bounds each nft transaction (TimeoutFlag; 0: CallBound's
// size-derived bound); the listings are not bounded.
func NewNamespaceBackend(ns *netns.Namespace, cfg Config, timeout time.Duration) (*Backend, error) {
	table := cfg.Table
	if table == "" {
		table = "kube-proxy"
	}
	nft, err := NewInNamespace(ns, knftables.IPv4Family, table)
	if err != nil {
		return nil, fmt.Errorf("could not use nftables in %s: %w", ns.Name, err)
	}
	list := func(args ...string) ([]byte, error) {
		out, err := ns.Exec("nft", append(args, "list", "table", "ip", table)...)
		if err != nil {
			return nil, fmt.Errorf("nft list table in %s: %w: %s", ns.Name, err, out)
		}
		return out, nil
	}
	return NewBackend(cfg, nft, BackendOptions{
		ListText: func(context.Context) (string, error) { b, err := list(); return string(b), err },
		ListJSON: func(context.Context) ([]byte, error) { return list("-j") },
		Timeout:  timeout,
	})
}
