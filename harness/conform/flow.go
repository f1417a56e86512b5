package conform

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/traffic"
)

// flowInterval is the spacing of a UDP flow's datagrams (400 a second:
// the time to recover is measured to 2.5 ms), and maxFlowDatagrams bounds
// one flow (a minute of it, stretched with the run's waits).
const flowInterval = 2500 * time.Microsecond

var maxFlowDatagrams = uint32(timeScaled(time.Minute) / flowInterval)

// flow is one UDP flow: datagrams on one 5-tuple at a fixed rate, each
// carrying its sequence number, followed datagram by datagram through the
// prober's observers (Prober.Trace): where each one arrived, and the ICMP
// errors the client got back.
type flow struct {
	p      *Prober
	sender *traffic.Sender
	src    netip.AddrPort
	dst    netip.AddrPort
	tag    uint32

	mu      sync.Mutex
	sent    []time.Time               // send time by sequence number
	arrived map[uint32]netip.AddrPort // sequence number -> endpoint
	rejects []time.Time               // ICMP errors about the flow
	first   chan struct{}             // closed at the first arrival
	firstAt netip.AddrPort            // the endpoint of the first arrival
	failed  map[uint32]bool           // datagrams the sender could not write
	drops0  uint64                    // the observers' drops at the start
	drops   uint64                    // and during the flow (stop)

	cancel context.CancelFunc
	done   chan struct{}
}

// startFlow starts a phase, traces it, and sends from client at src to dst
// until stop, ctx's end or maxFlowDatagrams.
func startFlow(ctx context.Context, p *Prober, client *netns.Client, src, dst netip.AddrPort) (*flow, error) {
	sender := p.senders[client.NS]
	if sender == nil {
		return nil, fmt.Errorf("no sender for client %s", client.NS.Name)
	}
	p.Phase()
	p.mu.Lock()
	tag := p.tag
	p.mu.Unlock()
	f := &flow{p: p, sender: sender, src: src, dst: dst, tag: tag, arrived: map[uint32]netip.AddrPort{},
		failed: map[uint32]bool{}, first: make(chan struct{}), done: make(chan struct{}), drops0: p.observerDrops()}
	p.Trace(f.record)
	ctx, f.cancel = context.WithCancel(ctx)
	go f.send(ctx)
	return f, nil
}

// record is the prober's trace: the flow's own packets only. Every probe
// arrival of the phase is the flow's (its tag; the prober checked it),
// whatever source address the node gave it (masquerade); an ICMP error is
// the flow's when it quotes the flow's source.
func (f *flow) record(t traced) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t.Reject {
		if t.Src == f.src {
			f.rejects = append(f.rejects, t.At)
		}
		return
	}
	seq := t.ID & 0xffffff
	if _, dup := f.arrived[seq]; dup {
		return
	}
	if len(f.arrived) == 0 {
		f.firstAt = t.Endpoint
		close(f.first)
	}
	f.arrived[seq] = t.Endpoint
}

func (f *flow) send(ctx context.Context) {
	defer close(f.done)
	b := traffic.NewBuilder()
	tick := time.NewTicker(flowInterval)
	defer tick.Stop()
	for seq := uint32(0); seq < maxFlowDatagrams; seq++ {
		pkt, err := b.Build(traffic.UDP, f.src, f.dst, f.tag<<24|seq)
		if err != nil {
			return
		}
		f.mu.Lock()
		f.sent = append(f.sent, time.Now())
		f.mu.Unlock()
		if err := f.sender.Send(pkt, f.dst.Addr()); err != nil {
			f.mu.Lock()
			f.failed[seq] = true
			f.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// awaitFirst waits (bounded) for the flow's first arrival and returns its
// endpoint.
func (f *flow) awaitFirst(d time.Duration) (netip.AddrPort, error) {
	select {
	case <-f.first:
	case <-time.After(d):
		return netip.AddrPort{}, fmt.Errorf("no datagram of the flow %s -> %s arrived at an endpoint within %s", f.src, f.dst, d)
	case <-f.done:
		return netip.AddrPort{}, fmt.Errorf("the flow %s -> %s stopped before its first arrival", f.src, f.dst)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.firstAt, nil
}

// stop ends the flow, waits for its trailing datagrams (quietPeriod) and
// stops tracing.
func (f *flow) stop() {
	f.cancel()
	<-f.done
	time.Sleep(quietPeriod)
	f.p.Trace(nil)
	f.drops = f.p.observerDrops() - f.drops0
}

// errCount is how many datagrams could not be sent.
func (f *flow) errCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.failed)
}

// seqAt is the first sequence number sent at or after t.
func (f *flow) seqAt(t time.Time) uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, at := range f.sent {
		if !at.Before(t) {
			return uint32(i)
		}
	}
	return uint32(len(f.sent))
}

// window is what happened to the datagrams sent in [from, to) (those the
// sender could not write left out: n counts the others): arrivals per
// endpoint, the ones that arrived nowhere, the ICMP errors in it.
type window struct {
	from, to uint32 // sequence numbers
	n        int
	per      map[netip.AddrPort]int
	nowhere  int
	rejects  int
}

func (f *flow) window(from, to uint32, t0, t1 time.Time) window {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := window{from: from, to: to, per: map[netip.AddrPort]int{}}
	for s := from; s < to && int(s) < len(f.sent); s++ {
		if f.failed[s] {
			continue
		}
		w.n++
		if e, ok := f.arrived[s]; ok {
			w.per[e]++
		} else {
			w.nowhere++
		}
	}
	for _, r := range f.rejects {
		if !r.Before(t0) && r.Before(t1) {
			w.rejects++
		}
	}
	return w
}

// recovery is the first datagram sent at or after t whose arrival is good,
// how long after t it was sent, and how many sent before it (from t) were
// not good (arrived elsewhere or nowhere). ok is false when none was.
func (f *flow) recovery(t time.Time, good func(netip.AddrPort) bool) (after time.Duration, lost int, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s, at := range f.sent {
		if at.Before(t) || f.failed[uint32(s)] {
			continue
		}
		if e, arrived := f.arrived[uint32(s)]; arrived && good(e) {
			return at.Sub(t), lost, true
		}
		lost++
	}
	return 0, lost, false
}
