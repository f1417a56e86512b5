package ipvs

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/dataplane/netns"
)

// Available reports whether the running kernel has IPVS, without loading
// anything: the ip_vs module is loaded (or built in) when /sys/module/ip_vs
// or /proc/net/ip_vs exists. On a kernel without it the error says so.
func Available() error {
	for _, p := range []string{"/sys/module/ip_vs", "/proc/net/ip_vs"} {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
	}
	return errors.New("the running kernel has no IPVS (no /sys/module/ip_vs, no /proc/net/ip_vs): it is not built in or not loaded")
}

// Namespace is the real System and IPVS handle of one node namespace. The
// IPVS and route netlink sockets are opened inside the namespace (netns.Do)
// and stay there; commands are forked from a thread inside it.
type Namespace struct {
	ns *netns.Namespace

	mu   sync.Mutex
	nl   *netlink.Handle
	ipvs *libipvs.Handle
}

var _ System = (*Namespace)(nil)

// OpenNamespace opens the IPVS and netlink sockets in ns. It refuses to run
// on a kernel without IPVS (Available): github.com/moby/ipvs would try
// `modprobe ip_vs` otherwise, and this project loads modules only inside its
// VM.
func OpenNamespace(ns *netns.Namespace) (*Namespace, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	n := &Namespace{ns: ns}
	err := ns.Do(func() error {
		var err error
		if n.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
			return fmt.Errorf("could not open a netlink socket: %w", err)
		}
		// An empty path means the calling thread's namespace: no switch.
		if n.ipvs, err = libipvs.New(""); err != nil {
			return fmt.Errorf("could not open the ipvs netlink socket: %w", err)
		}
		return nil
	})
	if err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// IPVS returns the namespace's IPVS handle.
func (n *Namespace) IPVS() Interface { return n.ipvs }

// Close releases the sockets. A socket keeps its namespace alive, so every
// Namespace must be closed for the kernel to free the node's IPVS table.
func (n *Namespace) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ipvs != nil {
		n.ipvs.Close()
		n.ipvs = nil
	}
	if n.nl != nil {
		n.nl.Close()
		n.nl = nil
	}
}

// EnsureDummy creates the dummy link, down, with an alternative name that
// carries the run's prefix when the namespace is one of ours.
func (n *Namespace) EnsureDummy(name string) error {
	if _, err := n.nl.LinkByName(name); err == nil {
		return nil
	}
	l := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := n.nl.LinkAdd(l); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("could not add dummy link %s in %s: %w", name, n.ns.Name, err)
	}
	if id, _, ok := netns.ParseName(n.ns.Name); ok {
		if got, err := n.nl.LinkByName(name); err == nil {
			// Best effort: the altname only helps `sim cleanup` and people.
			_ = n.nl.LinkAddAltName(got, netns.RunPrefix(id)+name)
		}
	}
	return nil
}

// DeleteLink removes a link if it exists.
func (n *Namespace) DeleteLink(name string) error {
	l, err := n.nl.LinkByName(name)
	if err != nil {
		return nil
	}
	if err := n.nl.LinkDel(l); err != nil {
		return fmt.Errorf("could not delete link %s in %s: %w", name, n.ns.Name, err)
	}
	return nil
}

// Addresses lists the link's IPv4 addresses.
func (n *Namespace) Addresses(link string) ([]netip.Addr, error) {
	l, err := n.nl.LinkByName(link)
	if err != nil {
		return nil, fmt.Errorf("could not find link %s in %s: %w", link, n.ns.Name, err)
	}
	addrs, err := n.nl.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("could not list addresses of %s in %s: %w", link, n.ns.Name, err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if x, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, x.Unmap())
		}
	}
	return out, nil
}

func (n *Namespace) addr(link string, a netip.Addr, add bool) error {
	l, err := n.nl.LinkByName(link)
	if err != nil {
		return fmt.Errorf("could not find link %s in %s: %w", link, n.ns.Name, err)
	}
	na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	if add {
		err = n.nl.AddrAdd(l, na)
		if errors.Is(err, unix.EEXIST) {
			err = nil
		}
	} else {
		err = n.nl.AddrDel(l, na)
		if errors.Is(err, unix.EADDRNOTAVAIL) {
			err = nil
		}
	}
	if err != nil {
		verb := map[bool]string{true: "add", false: "remove"}[add]
		return fmt.Errorf("could not %s %s on %s in %s: %w", verb, a, link, n.ns.Name, err)
	}
	return nil
}

// AddAddress binds a /32 to the link.
func (n *Namespace) AddAddress(link string, a netip.Addr) error { return n.addr(link, a, true) }

// DelAddress removes a /32 from the link.
func (n *Namespace) DelAddress(link string, a netip.Addr) error { return n.addr(link, a, false) }

// Run runs a command inside the namespace.
func (n *Namespace) Run(stdin string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := n.ns.Run(cmd); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = msg[:2000] + "..."
		}
		return out.String(), fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), n.ns.Name, err, msg)
	}
	return out.String(), nil
}

// Sysctl writes a sysctl of the namespace.
func (n *Namespace) Sysctl(key, value string) error { return n.ns.Sysctl(key, value) }

// ReadSysctl reads a sysctl of the namespace.
func (n *Namespace) ReadSysctl(key string) (string, error) { return n.ns.ReadSysctl(key) }

// StatsPerCPU reads /proc/net/ip_vs_stats_percpu as the namespace sees it
// (thread-self: /proc/net follows the process's main thread otherwise).
func (n *Namespace) StatsPerCPU() (string, error) {
	var out []byte
	err := n.ns.Do(func() error {
		var err error
		out, err = os.ReadFile("/proc/thread-self/net/ip_vs_stats_percpu")
		return err
	})
	if err != nil {
		return "", fmt.Errorf("could not read the ipvs totals: %w", err)
	}
	return string(out), nil
}

// KernelRelease is uname -r.
func (n *Namespace) KernelRelease() string { return KernelRelease() }

// KernelRelease is the running kernel's release (uname -r).
func KernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
