package ipvs

import (
	"errors"
	"net/netip"
	"os"

	libipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"
)

// Interface is the part of the IPVS netlink API the backend uses, with
// github.com/moby/ipvs's types (kube-proxy's library). *libipvs.Handle
// implements it; so does Fake. Errors are the kernel's: EEXIST for a
// service or destination that exists, ESRCH for a service that does not,
// ENOENT for a destination that does not or an unknown scheduler (see
// IsExist, IsNotFound).
type Interface interface {
	// GetServices lists every virtual server with its statistics.
	// Equivalent to `ipvsadm -Ln --stats`.
	GetServices() ([]*libipvs.Service, error)
	// NewService adds a virtual server. Equivalent to `ipvsadm -A`.
	NewService(*libipvs.Service) error
	// UpdateService changes a virtual server's scheduler, flags and
	// timeout. Equivalent to `ipvsadm -E`.
	UpdateService(*libipvs.Service) error
	// DelService removes a virtual server and its real servers.
	// Equivalent to `ipvsadm -D`.
	DelService(*libipvs.Service) error
	// GetDestinations lists a virtual server's real servers with their
	// connection counts and statistics.
	GetDestinations(*libipvs.Service) ([]*libipvs.Destination, error)
	// NewDestination adds a real server. Equivalent to `ipvsadm -a`.
	NewDestination(*libipvs.Service, *libipvs.Destination) error
	// UpdateDestination changes a real server's weight. Equivalent to
	// `ipvsadm -e`.
	UpdateDestination(*libipvs.Service, *libipvs.Destination) error
	// DelDestination removes a real server. Equivalent to `ipvsadm -d`.
	DelDestination(*libipvs.Service, *libipvs.Destination) error
	// SetConfig sets the connection timeouts. Equivalent to
	// `ipvsadm --set tcp tcpfin udp`.
	SetConfig(*libipvs.Config) error
	// Flush removes every virtual server. Equivalent to `ipvsadm -C`.
	Flush() error
	// Close releases the netlink socket.
	Close()
}

var _ Interface = (*libipvs.Handle)(nil)

// System is what the backend does in the node namespace besides IPVS: the
// dummy device and its addresses, ipset and iptables-restore, sysctls, and
// the kernel's live IPVS totals. Namespace implements it for a real node;
// FakeSystem for tests.
type System interface {
	// EnsureDummy creates the dummy device if it is missing (left down, as
	// kube-proxy leaves it). Equivalent to `ip link add NAME type dummy`.
	EnsureDummy(name string) error
	// DeleteLink removes a link if it exists. Equivalent to
	// `ip link del NAME`.
	DeleteLink(name string) error
	// Addresses lists the IPv4 addresses on a link.
	Addresses(link string) ([]netip.Addr, error)
	// AddAddress adds a /32. Equivalent to `ip addr add A/32 dev LINK`.
	AddAddress(link string, a netip.Addr) error
	// DelAddress removes a /32. Equivalent to `ip addr del A/32 dev LINK`.
	DelAddress(link string, a netip.Addr) error
	// Run runs a command with stdin in the namespace and returns its
	// standard output: ipset, iptables-restore, iptables-save.
	Run(stdin string, name string, args ...string) (string, error)
	// Sysctl writes a sysctl of the namespace (a path under /proc/sys).
	Sysctl(key, value string) error
	// ReadSysctl reads a sysctl of the namespace.
	ReadSysctl(key string) (string, error)
	// StatsPerCPU returns /proc/net/ip_vs_stats_percpu of the namespace:
	// the live (not estimated) totals.
	StatsPerCPU() (string, error)
	// KernelRelease is uname -r.
	KernelRelease() string
}

// IsExist reports whether err is the kernel's "already exists" (EEXIST).
func IsExist(err error) bool { return errors.Is(err, unix.EEXIST) || errors.Is(err, os.ErrExist) }

// IsNotFound reports whether err is the kernel's "no such service" (ESRCH)
// or "no such destination" (ENOENT).
func IsNotFound(err error) bool {
	return errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist)
}
