package conntrack

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/dataplane/netns"
)

// NamespaceTable is the conntrack table of a network namespace, through a
// netfilter netlink socket opened inside it: every call acts there and
// never on the host's table.
type NamespaceTable struct {
	mu sync.Mutex
	h  *netlink.Handle
}

var _ Table = (*NamespaceTable)(nil)

// NewNamespaceTable opens ns's table (close it with Close).
func NewNamespaceTable(ns *netns.Namespace) (*NamespaceTable, error) {
	h, err := ns.OpenNetlink(unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("could not open the conntrack table of %s: %w", ns.Name, err)
	}
	return &NamespaceTable{h: h}, nil
}

// List returns every IPv4 entry; an interrupted dump returns what it read
// with the error.
func (t *NamespaceTable) List() ([]*netlink.ConntrackFlow, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	flows, err := t.h.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, err
	}
	return flows, err
}

// Delete deletes the entries whose tuples match flows'.
func (t *NamespaceTable) Delete(flows []*netlink.ConntrackFlow) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, err := t.h.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, newFilter(flows))
	return int(n), err
}

// Create adds the entries (each with its own timeout; a TCP entry with
// its ProtoInfo state) and returns how many it added before an error.
func (t *NamespaceTable) Create(flows []*netlink.ConntrackFlow) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, f := range flows {
		if err := t.h.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, f); err != nil {
			return i, fmt.Errorf("could not create the conntrack entry %s: %w", Describe(f), err)
		}
	}
	return len(flows), nil
}

// Flush deletes every entry.
func (t *NamespaceTable) Flush() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.h.ConntrackTableFlush(netlink.ConntrackTable)
}

// Close closes the socket.
func (t *NamespaceTable) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.h.Close()
	return nil
}
