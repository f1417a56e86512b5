// Package conntrack removes a node's stale UDP conntrack entries as
// kube-proxy v1.37.2 does after a sync (pkg/proxy/conntrack/cleanup.go,
// CleanStaleEntries), in all three modes: UDP has no connection to close,
// so an entry whose DNAT points at an endpoint that is gone keeps a flow
// black-holed for as long as packets keep refreshing it, and an entry made
// while a Service had no endpoint keeps the flow un-NATed after one
// appears. TCP entries are left alone (an established TCP connection to a
// terminating endpoint keeps working, graceful termination).
//
// Which entries: UDP entries whose original destination is a frontend of a
// UDP service port (its cluster IP, load-balancer IPs or external IPs and
// port; or, when the port has serving endpoints, its node port on any
// address) and whose reply source is not one of that port's serving
// endpoints (ready, or serving while terminating; traffic policies and
// topology do not count, so that a change to the Service does not move
// existing flows). A service port without serving endpoints loses every
// entry to its IP frontends. When: after a successful sync that drained an
// endpoint change of a Service with a UDP port (Required: kube-proxy's
// ConntrackCleanupRequired). Deletion through the conntrack netlink
// interface inside the node's namespace (Table), never the host's.
package conntrack

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpsim/kpsim/dataplane/proxy"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Table is one network namespace's IPv4 conntrack table.
type Table interface {
	// List returns every entry.
	List() ([]*netlink.ConntrackFlow, error)
	// Delete deletes the entries (matched by their two tuples) and returns
	// how many it deleted.
	Delete(flows []*netlink.ConntrackFlow) (int, error)
}

// Required is kube-proxy's ConntrackCleanupRequired: the sync drained an
// endpoint change of a Service that has a UDP port (the changed port's
// own protocol, or another port of its Service in st).
func Required(ch cluster.Changes, st *cluster.State) bool {
	udp := map[types.NamespacedName]bool{}
	for spn := range st.Services {
		if spn.Protocol == corev1.ProtocolUDP {
			udp[spn.NamespacedName] = true
		}
	}
	for _, spn := range ch.Endpoints {
		if spn.Protocol == corev1.ProtocolUDP || udp[spn.NamespacedName] {
			return true
		}
	}
	return false
}

// frontend is a destination of a service port as conntrack's original
// tuple holds it.
type frontend struct {
	addr netip.Addr // invalid: a node port, any address
	port uint16
}

// Stale returns the entries CleanStaleEntries deletes for st.
func Stale(entries []*netlink.ConntrackFlow, st *cluster.State) []*netlink.ConntrackFlow {
	serving := map[frontend]map[netip.AddrPort]bool{}
	for spn, sp := range st.Services {
		if spn.Protocol != corev1.ProtocolUDP {
			continue
		}
		eps := map[netip.AddrPort]bool{}
		for _, e := range st.Endpoints[spn] {
			if e.Ready || e.Serving {
				eps[netip.AddrPortFrom(e.IP, uint16(e.Port))] = true
			}
		}
		port := uint16(sp.Port)
		if sp.ClusterIP.IsValid() {
			serving[frontend{sp.ClusterIP, port}] = eps
		}
		for _, a := range sp.LoadBalancerIPs {
			serving[frontend{a, port}] = eps
		}
		for _, a := range sp.ExternalIPs {
			serving[frontend{a, port}] = eps
		}
		// A node port is matched on the port alone: with no serving
		// endpoint every flow to that port number would go, including
		// flows that are not the Service's, so kube-proxy skips it.
		if sp.NodePort != 0 && len(eps) > 0 {
			serving[frontend{port: uint16(sp.NodePort)}] = eps
		}
	}
	var out []*netlink.ConntrackFlow
	for _, f := range entries {
		if f.Forward.Protocol != unix.IPPROTO_UDP {
			continue
		}
		dst, ok1 := netip.AddrFromSlice(f.Forward.DstIP)
		src, ok2 := netip.AddrFromSlice(f.Reverse.SrcIP)
		if !ok1 || !ok2 {
			continue
		}
		reply := netip.AddrPortFrom(src.Unmap(), f.Reverse.SrcPort)
		if eps, ok := serving[frontend{dst.Unmap(), f.Forward.DstPort}]; ok && !eps[reply] {
			out = append(out, f)
			continue
		}
		if eps, ok := serving[frontend{port: f.Forward.DstPort}]; ok && !eps[reply] {
			out = append(out, f)
		}
	}
	return out
}

// Clean lists t, deletes the stale entries for st and returns how many it
// deleted. A listing cut short (the kernel's dump interrupted) is cleaned
// as far as it goes, as kube-proxy does.
func Clean(t Table, st *cluster.State) (int, error) {
	entries, err := t.List()
	if err != nil && entries == nil {
		return 0, fmt.Errorf("could not list the conntrack table: %w", err)
	}
	stale := Stale(entries, st)
	if len(stale) == 0 {
		return 0, nil
	}
	n, err := t.Delete(stale)
	if err != nil {
		return n, fmt.Errorf("could not delete %d stale conntrack entries (%d deleted): %w", len(stale), n, err)
	}
	return n, nil
}

// Cleaner cleans one node's table after its syncs (a
// dataplane.ConntrackCleaner), with the faults that act on it:
// FaultNoConntrackCleanup cleans nothing, FaultConntrackFlushAll deletes
// every entry after each sync that drained a change.
type Cleaner struct {
	Table  Table
	Faults proxy.Faults
}

// Required is Required(ch, st), or what the faults make of it.
func (c Cleaner) Required(ch cluster.Changes, st *cluster.State) bool {
	switch {
	case c.Faults.Has(proxy.FaultNoConntrackCleanup):
		return false
	case c.Faults.Has(proxy.FaultConntrackFlushAll):
		return !ch.Empty()
	}
	return Required(ch, st)
}

// Clean is Clean(c.Table, st); under FaultConntrackFlushAll it deletes
// every entry.
func (c Cleaner) Clean(st *cluster.State) (int, error) {
	if !c.Faults.Has(proxy.FaultConntrackFlushAll) {
		return Clean(c.Table, st)
	}
	entries, err := c.Table.List()
	if err != nil && entries == nil {
		return 0, fmt.Errorf("could not list the conntrack table: %w", err)
	}
	return c.Table.Delete(entries)
}

// Describe is an entry in one line: protocol, original source and
// destination, and the reply's source (where the flow was NATed to).
func Describe(f *netlink.ConntrackFlow) string {
	proto := map[uint8]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_SCTP: "sctp"}[f.Forward.Protocol]
	if proto == "" {
		proto = fmt.Sprint(f.Forward.Protocol)
	}
	return fmt.Sprintf("%s %s:%d -> %s:%d reply from %s:%d", proto, f.Forward.SrcIP, f.Forward.SrcPort,
		f.Forward.DstIP, f.Forward.DstPort, f.Reverse.SrcIP, f.Reverse.SrcPort)
}

// flowKey identifies an entry by its two tuples, as kube-proxy's filter
// does.
func flowKey(f *netlink.ConntrackFlow) string {
	return fmt.Sprintf("%d#%s#%d#%s#%d#%s#%d#%s#%d", f.Forward.Protocol,
		f.Forward.SrcIP, f.Forward.SrcPort, f.Forward.DstIP, f.Forward.DstPort,
		f.Reverse.SrcIP, f.Reverse.SrcPort, f.Reverse.DstIP, f.Reverse.DstPort)
}

// flowFilter matches the entries of a list (netlink.CustomConntrackFilter).
type flowFilter map[string]bool

func (m flowFilter) MatchConntrackFlow(f *netlink.ConntrackFlow) bool { return m[flowKey(f)] }

func newFilter(flows []*netlink.ConntrackFlow) flowFilter {
	m := flowFilter{}
	for _, f := range flows {
		m[flowKey(f)] = true
	}
	return m
}
