package traffic

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Sender writes probe packets on a raw IPv4 socket (IP_HDRINCL). Open it
// inside the client's namespace (dataplane/netns.Do): the socket stays there.
type Sender struct {
	fd     int
	errors atomic.Uint64
}

// OpenSender opens a raw sending socket in the calling thread's namespace.
func OpenSender() (*Sender, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil, fmt.Errorf("could not open a raw socket (needs CAP_NET_RAW): %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_HDRINCL, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("could not set IP_HDRINCL: %w", err)
	}
	// A large send buffer lets bursts queue instead of failing with ENOBUFS.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
	return &Sender{fd: fd}, nil
}

// Send writes one packet to dst. ENOBUFS (the device queue is full) is
// retried a bounded number of times after a short pause. A packet that could
// not be written is counted in Errors.
func (s *Sender) Send(pkt []byte, dst netip.Addr) error {
	sa := &unix.SockaddrInet4{Addr: dst.As4()}
	for try := 0; ; try++ {
		err := unix.Sendto(s.fd, pkt, 0, sa)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.ENOBUFS) && !errors.Is(err, unix.EAGAIN) || try == 100 {
			s.errors.Add(1)
			return fmt.Errorf("could not send probe to %s: %w", dst, err)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// Errors is the number of packets Send could not write since the socket was
// opened (cumulative).
func (s *Sender) Errors() uint64 { return s.errors.Load() }

// IsTransient reports whether a Send error only means the queue was full
// for too long (ENOBUFS, EAGAIN): that probe was not sent, later ones may be.
func IsTransient(err error) bool { return errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) }

// Close closes the socket.
func (s *Sender) Close() error { return unix.Close(s.fd) }

// Observer reads packets arriving at the local addresses of its namespace on
// raw sockets (one per protocol): every TCP SYN and UDP probe for the
// backends, or ICMP errors for the clients. Open it inside the namespace.
//
// Each socket asks for a receive buffer of ObserverBuffer bytes with
// SO_RCVBUFFORCE, which ignores net.core.rmem_max (it needs CAP_NET_ADMIN in
// the namespace's user namespace; root has it), and falls back to SO_RCVBUF,
// which the kernel silently caps at rmem_max. Buffer says which one held.
// SO_RXQ_OVFL makes the kernel attach the socket's drop counter (packets it
// discarded because the buffer was full) to every packet delivered; Drops
// reads it, and SO_MEMINFO for the drops after the last delivered packet.
type Observer struct {
	fds    []int
	drops  []atomic.Uint64 // the largest SO_RXQ_OVFL count seen, per socket
	buffer string
}

// ObserverBuffer is the receive buffer an observer socket asks for: about
// 16 MiB holds some 200,000 queued probes (a probe's skb costs about 768
// bytes of buffer accounting), more than a block of the prober sends.
const ObserverBuffer = 16 << 20

// OpenObserver opens raw receiving sockets for the given IP protocols
// (unix.IPPROTO_TCP, IPPROTO_UDP, IPPROTO_ICMP).
func OpenObserver(protos ...int) (*Observer, error) {
	o := &Observer{drops: make([]atomic.Uint64, len(protos))}
	var bufs []string
	for _, p := range protos {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, p)
		if err != nil {
			o.Close()
			return nil, fmt.Errorf("could not open a raw socket for protocol %d: %w", p, err)
		}
		o.fds = append(o.fds, fd)
		bufs = append(bufs, receiveBuffer(fd))
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1); err != nil {
			o.Close()
			return nil, fmt.Errorf("could not enable SO_RXQ_OVFL (the drop counter) on the raw socket for protocol %d: %w", p, err)
		}
		tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			o.Close()
			return nil, fmt.Errorf("could not set a receive timeout: %w", err)
		}
	}
	o.buffer = strings.Join(bufs, "; ")
	return o, nil
}

// receiveBuffer sets the socket's receive buffer and says how.
func receiveBuffer(fd int) string {
	how := "SO_RCVBUFFORCE"
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, ObserverBuffer); err != nil {
		how = "SO_RCVBUF (SO_RCVBUFFORCE refused: " + err.Error() + "; capped by net.core.rmem_max)"
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, ObserverBuffer)
	}
	got, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		return how + ", size unknown"
	}
	// The kernel doubles the value asked for (bookkeeping overhead) and
	// reports the doubled size.
	return fmt.Sprintf("%s, %d bytes", how, got)
}

// Buffer says how the receive buffers were set and their size, per socket:
// a debug field for reports.
func (o *Observer) Buffer() string { return o.buffer }

// Run reads until ctx ends, calling handle with each packet (IP header
// included) from one goroutine per socket; handle must be safe for
// concurrent use. The kernel's drop counter arrives with every packet and is
// kept for Drops. Run returns ctx's error, or the first read error.
func (o *Observer) Run(ctx context.Context, handle func([]byte)) error {
	errs := make(chan error, len(o.fds))
	for i, fd := range o.fds {
		go func(i, fd int) {
			buf := make([]byte, 2048)
			oob := make([]byte, unix.CmsgSpace(4)*2)
			for ctx.Err() == nil {
				n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
				if err != nil {
					if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
						continue
					}
					errs <- fmt.Errorf("could not read raw socket: %w", err)
					return
				}
				if d, ok := rxqOverflow(oob[:oobn]); ok {
					for {
						cur := o.drops[i].Load()
						if uint64(d) <= cur || o.drops[i].CompareAndSwap(cur, uint64(d)) {
							break
						}
					}
				}
				handle(buf[:n])
			}
			errs <- nil
		}(i, fd)
	}
	var first error
	for range o.fds {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return first
	}
	return ctx.Err()
}

// rxqOverflow finds the SO_RXQ_OVFL control message (a uint32: the
// socket's cumulative drop count) in a recvmsg control buffer, without
// allocating.
func rxqOverflow(oob []byte) (uint32, bool) {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return 0, false
		}
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SO_RXQ_OVFL && l >= unix.CmsgLen(4) {
			return binary.NativeEndian.Uint32(oob[unix.CmsgLen(0):]), true
		}
		oob = oob[min(len(oob), unix.CmsgSpace(l-unix.CmsgLen(0))):]
	}
	return 0, false
}

// Drops is the number of packets the kernel discarded on this observer's
// sockets because a receive buffer was full, since they were opened
// (cumulative, summed over the sockets). It is the larger of the last
// SO_RXQ_OVFL count delivered with a packet and the socket's current
// SK_MEMINFO_DROPS (SO_MEMINFO), which also covers drops after the last
// packet read.
func (o *Observer) Drops() uint64 {
	var total uint64
	for i, fd := range o.fds {
		d := o.drops[i].Load()
		if m, err := memInfoDrops(fd); err == nil && m > d {
			d = m
		}
		total += d
	}
	return total
}

// memInfoDrops reads SK_MEMINFO_DROPS with getsockopt(SO_MEMINFO) (Linux
// 4.12 and later).
func memInfoDrops(fd int) (uint64, error) {
	const skMemInfoDrops, skMemInfoVars = 8, 9
	var info [skMemInfoVars]uint32
	l := uint32(unsafe.Sizeof(info))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_MEMINFO,
		uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return 0, e
	}
	if l < (skMemInfoDrops+1)*4 {
		return 0, errors.New("SO_MEMINFO returned no drop counter")
	}
	return uint64(info[skMemInfoDrops]), nil
}

// Close closes the sockets.
func (o *Observer) Close() error {
	var err error
	for _, fd := range o.fds {
		err = errors.Join(err, unix.Close(fd))
	}
	o.fds = nil
	return err
}
