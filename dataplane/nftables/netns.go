package nftables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
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
	// path is the nft binary Run executes.
	path string
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
	path, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("the nft command is missing (Debian package nftables): %w", err)
	}
	return &nsNFT{ns: ns, inner: inner, path: path}, nil
}

func (n *nsNFT) NewTransaction() *knftables.Transaction { return n.inner.NewTransaction() }

// Run runs tx with `nft -f -` inside the namespace, as knftables does,
// except that each run of consecutive element additions to one set or map
// goes as one command (MergeElements): the kernel receives the same
// objects, and nft parses and sends them in about two thirds of the time
// (a full sync of 1,000 Services x 10 endpoints writes 12,000 elements).
// The error names nft's message; isNotFound holds for its "No such file
// or directory", as knftables.IsNotFound does for knftables' own.
func (n *nsNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	text := []byte(tx.String())
	if i := bytes.LastIndex(text, []byte("# ERROR: ")); i >= 0 && (i == 0 || text[i-1] == '\n') {
		return fmt.Errorf("the transaction could not be built: %s", bytes.TrimPrefix(text[i:], []byte("# ERROR: ")))
	}
	return n.ns.Do(func() error {
		cmd := exec.CommandContext(ctx, n.path, "-f", "-")
		cmd.Stdin = bytes.NewReader(MergeElements(text))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			return nftError(err, stderr.String())
		}
		return nil
	})
}

// runError is a failed nft run: its message (nft's first error line
// first) and, when that line says so, the errno it stands for.
type runError struct {
	Msg   string
	Errno syscall.Errno
	err   error
}

func (e *runError) Error() string { return e.Msg }

// Unwrap gives the errno (errors.Is(err, syscall.ENOENT)) and the exec
// error (a context's deadline among them).
func (e *runError) Unwrap() []error {
	out := []error{e.err}
	if e.Errno != 0 {
		out = append(out, e.Errno)
	}
	return out
}

// isNotFound says whether err is an nft "No such file or directory",
// from this package's runs or from knftables' (its Fake included).
func isNotFound(err error) bool {
	return knftables.IsNotFound(err) || errors.Is(err, syscall.ENOENT)
}

// nftError reads nft's stderr as knftables does: the errno of its first
// line.
func nftError(err error, stderr string) error {
	e := &runError{Msg: err.Error(), err: err}
	if stderr == "" {
		return e
	}
	e.Msg = strings.TrimSpace(stderr)
	first, _, _ := strings.Cut(stderr, "\n")
	switch {
	case strings.Contains(first, "No such file or directory"):
		e.Errno = syscall.ENOENT
	case strings.Contains(first, "File exists"):
		e.Errno = syscall.EEXIST
	}
	return e
}

// MergeElements rewrites nft text so that each run of consecutive lines
//
//	add element <family> <table> <set> { <element> }
//
// for one set becomes one line adding all of them, in order: what the
// kernel receives is the same. Every other line is kept as it is. The
// renderer's named sets and maps have no interval flag, so no merged
// command can meet the overlap checks a list of intervals would.
func MergeElements(text []byte) []byte {
	const verb = "add element "
	out := make([]byte, 0, len(text))
	var cur []byte // the open command's "add element ... <set>", or nil
	for len(text) > 0 {
		line := text
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			text = nil
		}
		var head, body []byte
		if bytes.HasPrefix(line, []byte(verb)) && bytes.HasSuffix(line, []byte(" }")) {
			if i := bytes.Index(line, []byte(" { ")); i > 0 {
				head, body = line[:i], line[i+3:len(line)-2]
			}
		}
		switch {
		case head != nil && cur != nil && bytes.Equal(head, cur):
			out = append(out, ", "...)
			out = append(out, body...)
		default:
			if cur != nil {
				out = append(out, " }\n"...)
				cur = nil
			}
			if head != nil {
				out = append(out, line[:len(line)-2]...)
				cur = head
				continue
			}
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	if cur != nil {
		out = append(out, " }\n"...)
	}
	return out
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
