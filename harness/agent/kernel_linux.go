package agent

// The kernel side: the raw sockets of harness/traffic and the echo ports'
// listeners, opened in the calling thread's network namespace (a pod's, in
// the binary; a test namespace's, inside netns.Do). Sockets stay in the
// namespace they were opened in, so Run, Send and the HTTP handler may run
// on any goroutine afterwards.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/harness/traffic"
)

// OpenEcho opens an echo agent's sockets: a listener per port (on every
// address) and a raw observer for TCP and UDP (CAP_NET_RAW).
func OpenEcho(info Info, ports []PortSpec) (*Echo, error) {
	if len(ports) == 0 {
		return nil, errors.New("an echo agent needs at least one port")
	}
	obs, err := traffic.OpenObserver(unix.IPPROTO_TCP, unix.IPPROTO_UDP)
	if err != nil {
		return nil, rawRefused(err)
	}
	info.ObserverBuffer = obs.Buffer()
	e := NewEcho(info, ports, obs)
	e.close = append(e.close, obs)
	for _, p := range ports {
		switch p.Proto {
		case traffic.TCP:
			l, err := net.ListenTCP("tcp4", &net.TCPAddr{Port: int(p.Port)})
			if err != nil {
				_ = e.Close()
				return nil, fmt.Errorf("could not listen on %s: %w", p, err)
			}
			e.tcp, e.close = append(e.tcp, l), append(e.close, l)
		case traffic.UDP:
			c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: int(p.Port)})
			if err != nil {
				_ = e.Close()
				return nil, fmt.Errorf("could not listen on %s: %w", p, err)
			}
			e.udp, e.close = append(e.udp, c), append(e.close, c)
		}
	}
	return e, nil
}

// OpenProber opens a probe agent's sockets: two raw IP_HDRINCL senders, a
// raw ICMP observer (CAP_NET_RAW both) and a UDP socket whose connect asks
// the kernel's route for the probes' source address.
func OpenProber(info Info) (*Prober, error) {
	var closers []io.Closer
	fail := func(err error) (*Prober, error) {
		for _, c := range closers {
			_ = c.Close()
		}
		return nil, rawRefused(err)
	}
	var senders []PacketSink
	for range 2 {
		s, err := traffic.OpenSender()
		if err != nil {
			return fail(err)
		}
		senders, closers = append(senders, s), append(closers, s)
	}
	obs, err := traffic.OpenObserver(unix.IPPROTO_ICMP)
	if err != nil {
		return fail(err)
	}
	closers = append(closers, obs)
	route, err := openRoute()
	if err != nil {
		return fail(err)
	}
	closers = append(closers, route)
	info.ObserverBuffer = obs.Buffer()
	p := NewProber(info, senders, route, obs)
	p.close = closers
	return p, nil
}

// rawRefused makes a refused raw socket say what the agent needs.
func rawRefused(err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("raw sockets refused: the agent needs CAP_NET_RAW (securityContext.capabilities.add: [NET_RAW]): %w", err)
	}
	return err
}

// routeSocket picks source addresses the way the kernel would for a
// connection to dst: it connects a UDP socket there (no packet is sent),
// reads the local address and disconnects (AF_UNSPEC), so the next lookup
// starts unbound again. One socket, opened in the agent's namespace,
// serves every lookup.
type routeSocket struct {
	mu sync.Mutex
	fd int
}

func openRoute() (*routeSocket, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("could not open a UDP socket for route lookups: %w", err)
	}
	return &routeSocket{fd: fd}, nil
}

// Source is the address the kernel's route to dst picks. Equivalent to
// `ip route get DST` (its src).
func (r *routeSocket) Source(dst netip.AddrPort) (netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := unix.Connect(r.fd, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}); err != nil {
		return netip.Addr{}, fmt.Errorf("no route to %s: %w", dst, err)
	}
	sa, err := unix.Getsockname(r.fd)
	// Disconnect: a UDP socket keeps the source address of its first
	// connect otherwise.
	unspec := unix.RawSockaddr{Family: unix.AF_UNSPEC}
	_, _, errno := unix.Syscall(unix.SYS_CONNECT, uintptr(r.fd), uintptr(unsafe.Pointer(&unspec)), unsafe.Sizeof(unspec))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("could not read the source address towards %s: %w", dst, err)
	}
	if errno != 0 {
		return netip.Addr{}, fmt.Errorf("could not disconnect the route socket: %w", errno)
	}
	in4, ok := sa.(*unix.SockaddrInet4)
	if !ok {
		return netip.Addr{}, fmt.Errorf("the route towards %s has no IPv4 source", dst)
	}
	return netip.AddrFrom4(in4.Addr), nil
}

func (r *routeSocket) Close() error { return unix.Close(r.fd) }

var (
	_ PacketSource = (*traffic.Observer)(nil)
	_ PacketSink   = (*traffic.Sender)(nil)
	_ Router       = (*routeSocket)(nil)
)
