package traffic

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// Sender writes probe packets on a raw IPv4 socket (IP_HDRINCL). Open it
// inside the client's namespace (dataplane/netns.Do): the socket stays there.
type Sender struct{ fd int }

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
// retried a bounded number of times after a short pause.
func (s *Sender) Send(pkt []byte, dst netip.Addr) error {
	sa := &unix.SockaddrInet4{Addr: dst.As4()}
	for try := 0; ; try++ {
		err := unix.Sendto(s.fd, pkt, 0, sa)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.ENOBUFS) && !errors.Is(err, unix.EAGAIN) || try == 100 {
			return fmt.Errorf("could not send probe to %s: %w", dst, err)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// Close closes the socket.
func (s *Sender) Close() error { return unix.Close(s.fd) }

// Observer reads packets arriving at the local addresses of its namespace on
// raw sockets (one per protocol): every TCP SYN and UDP probe for the
// backends, or ICMP errors for the clients. Open it inside the namespace.
type Observer struct {
	fds []int
}

// OpenObserver opens raw receiving sockets for the given IP protocols
// (unix.IPPROTO_TCP, IPPROTO_UDP, IPPROTO_ICMP).
func OpenObserver(protos ...int) (*Observer, error) {
	o := &Observer{}
	for _, p := range protos {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, p)
		if err != nil {
			o.Close()
			return nil, fmt.Errorf("could not open a raw socket for protocol %d: %w", p, err)
		}
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 16<<20)
		tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			unix.Close(fd)
			o.Close()
			return nil, fmt.Errorf("could not set a receive timeout: %w", err)
		}
		o.fds = append(o.fds, fd)
	}
	return o, nil
}

// Run reads until ctx ends, calling handle with each packet (IP header
// included) from one goroutine per socket; handle must be safe for
// concurrent use. It returns the number of receive-buffer drops the kernel
// reported, as far as it can tell (0 when unknown), and ctx's error.
func (o *Observer) Run(ctx context.Context, handle func([]byte)) error {
	errs := make(chan error, len(o.fds))
	for _, fd := range o.fds {
		go func(fd int) {
			buf := make([]byte, 2048)
			for ctx.Err() == nil {
				n, _, err := unix.Recvfrom(fd, buf, 0)
				if err != nil {
					if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
						continue
					}
					errs <- fmt.Errorf("could not read raw socket: %w", err)
					return
				}
				handle(buf[:n])
			}
			errs <- nil
		}(fd)
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

// Close closes the sockets.
func (o *Observer) Close() error {
	var err error
	for _, fd := range o.fds {
		err = errors.Join(err, unix.Close(fd))
	}
	o.fds = nil
	return err
}
