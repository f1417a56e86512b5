package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/kpsim/kpsim/harness/traffic"
)

// Echo is an echo agent: a Service's backend. Its ports are served as a
// normal server would (TCP: echo what the client sends, then close; UDP:
// echo each datagram that is not a probe), so the pod is an ordinary
// endpoint for readiness checks and for curl or nc; a raw observer counts
// the probes that reach those ports, by tag, endpoint and client.
//
// Probe datagrams are counted, not echoed: an answered UDP flow becomes an
// assured conntrack entry that lives 120 s instead of 30, longer for a
// repeated 5-tuple to meet, and the prober has no socket for the answer
// (its kernel would send an ICMP error back through the dataplane). A TCP
// probe is answered by the kernel (SYN-ACK), the prober's kernel resets it.
type Echo struct {
	*server
	ports  []PortSpec
	served map[PortSpec]bool
	tcp    []*net.TCPListener
	udp    []*net.UDPConn
	close  []io.Closer
}

// NewEcho returns an echo agent counting the probes obs delivers to ports.
// It serves no port itself: OpenEcho adds the listeners.
func NewEcho(info Info, ports []PortSpec, obs PacketSource) *Echo {
	info.Mode = ModeEcho
	info.Ports = nil
	e := &Echo{ports: slices.Clone(ports), served: map[PortSpec]bool{}}
	for _, p := range ports {
		e.served[p] = true
		info.Ports = append(info.Ports, p.String())
	}
	e.server = newServer(info, obs)
	e.mux.HandleFunc(PathSend, func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, errors.New("this agent is in echo mode: it counts probes and sends none (POST "+PathSend+" is the probe mode's)"))
	})
	return e
}

// ServeHTTP answers the agent's API.
func (e *Echo) ServeHTTP(w http.ResponseWriter, r *http.Request) { e.mux.ServeHTTP(w, r) }

// onPacket counts a packet of the raw observer if it is a probe that
// reached a served port.
func (e *Echo) onPacket(pkt []byte) {
	a, err := traffic.ParseArrival(pkt)
	if err != nil || !e.served[PortSpec{a.Proto, a.Dst.Port()}] || !isProbeArrival(pkt, a.Proto) {
		return
	}
	e.tally.arrival(uint8(a.ID>>24), a.Dst, a.Src.Addr())
}

// Run observes and serves the ports until ctx ends; it returns ctx's error,
// or the first error of an observer or a port.
func (e *Echo) Run(ctx context.Context) error {
	fns := []func(context.Context) error{func(ctx context.Context) error { return e.obs.Run(ctx, e.onPacket) }}
	for _, l := range e.tcp {
		fns = append(fns, func(ctx context.Context) error { return serveTCP(ctx, l) })
	}
	for _, c := range e.udp {
		fns = append(fns, func(ctx context.Context) error { return serveUDP(ctx, c) })
	}
	return runAll(ctx, fns...)
}

// Close closes the sockets OpenEcho opened.
func (e *Echo) Close() error {
	var err error
	for _, c := range e.close {
		if cerr := c.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
			err = errors.Join(err, cerr)
		}
	}
	return err
}

// Limits of the echo ports: connections served at once (more are closed
// at once), bytes echoed and time spent per connection.
const (
	maxEchoConns   = 64
	maxEchoBytes   = 64 << 10
	echoConnTimout = 10 * time.Second
)

// serveTCP accepts on l until ctx ends, echoing each connection's bytes
// (bounded) before closing it.
func serveTCP(ctx context.Context, l *net.TCPListener) error {
	stop := context.AfterFunc(ctx, func() { _ = l.SetDeadline(time.Now()) })
	defer stop()
	slots := make(chan struct{}, maxEchoConns)
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		select {
		case slots <- struct{}{}:
		default:
			_ = c.Close()
			continue
		}
		go func() {
			defer func() { <-slots }()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(echoConnTimout))
			_, _ = io.Copy(c, io.LimitReader(c, maxEchoBytes))
		}()
	}
}

// serveUDP echoes each datagram on c that is not a probe, until ctx ends.
func serveUDP(ctx context.Context, c *net.UDPConn) error {
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 65535)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		if n >= 2 && buf[0] == traffic.ProbeMagic>>8 && buf[1] == traffic.ProbeMagic&0xff {
			continue
		}
		_, _ = c.WriteToUDPAddrPort(buf[:n], from)
	}
}
