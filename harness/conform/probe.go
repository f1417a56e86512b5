package conform

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/traffic"
)

// Prober sends probes from client pod namespaces and counts what the
// backend namespaces receive and what rejects reach the clients. Probes
// carry a phase tag in their ID so that a late packet from an earlier phase
// is never counted in a later one.
type Prober struct {
	topo    *netns.Topology
	senders map[*netns.Client]*traffic.Sender
	extra   map[*netns.Client]*traffic.Sender
	obs     []*traffic.Observer
	cancel  context.CancelFunc
	done    sync.WaitGroup

	mu       sync.Mutex
	tag      uint32
	arrivals map[Key]int
	rejects  map[netip.Addr]int
	icmpElse map[uint8]int // other destination-unreachable codes
	foreign  int
	cond     *sync.Cond
	// sentTotal and sendTime measure the generator's rate.
	sentTotal int
	sendTime  time.Duration
	seen      int
}

// Key is an arrival: the post-DNAT endpoint and the client address.
type Key struct {
	Endpoint netip.AddrPort
	Client   netip.Addr
}

// replyDrops are the backend namespaces' OUTPUT rules that drop the
// kernel's answers to probes (see NewProber).
var replyDrops = [][]string{
	{"OUTPUT", "-p", "tcp", "--tcp-flags", "RST", "RST", "-j", "DROP"},
	{"OUTPUT", "-p", "icmp", "--icmp-type", "port-unreachable", "-j", "DROP"},
}

// Limits that bound every traffic loop.
const (
	maxProbesPerPhase = 2_000_000
)

// The waits of Collect, stretched by KPSIM_TIME_SCALE on a slow machine
// (the microVM's init sets it under software emulation, where a large
// phase's packets can trail its last send by seconds).
var (
	quietPeriod    = timeScaled(250 * time.Millisecond)
	maxCollectWait = timeScaled(5 * time.Second)
)

// timeScaled multiplies d by KPSIM_TIME_SCALE (a whole number, 1 to 20).
func timeScaled(d time.Duration) time.Duration {
	if n, err := strconv.Atoi(os.Getenv("KPSIM_TIME_SCALE")); err == nil && n > 1 && n <= 20 {
		return d * time.Duration(n)
	}
	return d
}

// NewProber opens the raw sockets: a sender in each client namespace, an
// observer for TCP and UDP in each backend namespace and for ICMP in each
// client namespace. It refuses to run without a topology of its own.
func NewProber(ctx context.Context, t *netns.Topology) (*Prober, error) {
	if t == nil || len(t.Clients()) == 0 {
		return nil, errors.New("probes are sent only from client namespaces this run created; the scenario has none")
	}
	p := &Prober{topo: t, senders: map[*netns.Client]*traffic.Sender{}, extra: map[*netns.Client]*traffic.Sender{}, arrivals: map[Key]int{}, rejects: map[netip.Addr]int{}, icmpElse: map[uint8]int{}}
	p.cond = sync.NewCond(&p.mu)
	for _, c := range t.Clients() {
		var s *traffic.Sender
		err := c.NS.Do(func() (err error) { s, err = traffic.OpenSender(); return })
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("client %s: %w", c.NS.Name, err)
		}
		p.senders[c] = s
		var o *traffic.Observer
		if err := c.NS.Do(func() (err error) { o, err = traffic.OpenObserver(unix.IPPROTO_ICMP); return }); err != nil {
			p.Close()
			return nil, fmt.Errorf("client %s: %w", c.NS.Name, err)
		}
		p.obs = append(p.obs, o)
	}
	nICMP := len(p.obs)
	for _, n := range t.Nodes() {
		// Backends answer probes in the kernel (a RST, or ICMP port
		// unreachable for UDP); those answers only cost the path back through
		// the node's conntrack. Drop them at the source, in the backend
		// namespace (ours): the node's conntrack entries then stay in
		// SYN_SENT until the phase's flush.
		for _, rule := range replyDrops {
			args := append([]string{"-w", "-A"}, rule...)
			if out, err := n.Backends.Exec("iptables-nft", args...); err != nil {
				p.Close()
				return nil, fmt.Errorf("backends of %s: could not silence replies: %w: %s", n.Config.Name, err, out)
			}
		}
		var o *traffic.Observer
		if err := n.Backends.Do(func() (err error) { o, err = traffic.OpenObserver(unix.IPPROTO_TCP, unix.IPPROTO_UDP); return }); err != nil {
			p.Close()
			return nil, fmt.Errorf("backends of %s: %w", n.Config.Name, err)
		}
		p.obs = append(p.obs, o)
	}
	ctx, p.cancel = context.WithCancel(ctx)
	for i, o := range p.obs {
		handle := p.onArrival
		if i < nICMP {
			handle = p.onICMP
		}
		p.done.Add(1)
		go func(o *traffic.Observer, h func([]byte)) {
			defer p.done.Done()
			_ = o.Run(ctx, h)
		}(o, handle)
	}
	return p, nil
}

func (p *Prober) onArrival(pkt []byte) {
	a, err := traffic.ParseArrival(pkt)
	if err != nil {
		return
	}
	p.mu.Lock()
	if a.ID>>24 == p.tag {
		p.arrivals[Key{a.Dst, a.Src.Addr()}]++
		p.seen++
		p.cond.Broadcast()
	} else {
		p.foreign++
	}
	p.mu.Unlock()
}

func (p *Prober) onICMP(pkt []byte) {
	u, err := traffic.ParseUnreachable(pkt)
	if err != nil {
		return
	}
	p.mu.Lock()
	// The quoted IP header's ID carries the probe's phase tag.
	if uint32(u.IPID>>8) == p.tag {
		if u.Code == traffic.CodePortUnreachable {
			p.rejects[u.Src.Addr()]++
		} else {
			p.icmpElse[u.Code]++
		}
		p.seen++
		p.cond.Broadcast()
	} else {
		p.foreign++
	}
	p.mu.Unlock()
}

// Close stops the observers and closes every socket.
func (p *Prober) Close() {
	if p.cancel != nil {
		p.cancel()
		p.done.Wait()
	}
	for _, s := range p.senders {
		_ = s.Close()
	}
	for _, s := range p.extra {
		_ = s.Close()
	}
	for _, o := range p.obs {
		_ = o.Close()
	}
}

// Phase starts a new counting phase: counts reset, late packets of earlier
// phases are ignored from now on.
func (p *Prober) Phase() {
	p.mu.Lock()
	p.tag = (p.tag + 1) & 0xff
	clear(p.arrivals)
	clear(p.rejects)
	clear(p.icmpElse)
	p.seen = 0
	p.mu.Unlock()
}

// Probe is one batch: n new connections from one client address to a
// Service, each with a fresh random source port.
type Probe struct {
	Client *netns.Client
	Src    netip.Addr
	VIP    netip.AddrPort
	Proto  traffic.Proto
	N      int
}

// Send writes a batch and returns the number sent. Source ports are a
// walk through the ephemeral range with a random start and stride, so they
// repeat only after 49,152 probes of a client address (a probe never meets
// a live conntrack entry of its own). Large batches are written by two
// goroutines, each on a socket of its own, interleaving the same walk.
func (p *Prober) Send(ctx context.Context, b Probe, r *rand.Rand) (int, error) {
	if p.senders[b.Client] == nil {
		return 0, fmt.Errorf("no sender for client %s", b.Client.NS.Name)
	}
	if b.N > maxProbesPerPhase {
		return 0, fmt.Errorf("%d probes exceed the bound of %d per phase", b.N, maxProbesPerPhase)
	}
	p.mu.Lock()
	tag := p.tag
	p.mu.Unlock()
	const lo, span = 16384, 49152
	start, step := r.IntN(span), 1+2*r.IntN(span/2)
	for gcd(step, span) != 1 {
		step += 2
	}
	workers := 1
	if b.N >= 2000 {
		workers = 2
	}
	start0 := time.Now()
	deadline := start0.Add(time.Duration(b.N)*50*time.Microsecond + 10*time.Second)
	sent := make([]int, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		s, err := p.sender(b.Client, w)
		if err != nil {
			return 0, err
		}
		wg.Add(1)
		go func(w int, s *traffic.Sender) {
			defer wg.Done()
			bl := traffic.NewBuilder()
			for i := w; i < b.N; i += workers {
				if sent[w]%4096 == 0 && (ctx.Err() != nil || time.Now().After(deadline)) {
					errs[w] = fmt.Errorf("sending stopped after %d of %d probes: %w", sent[w], b.N, errors.Join(ctx.Err(), errors.New("time bound reached")))
					return
				}
				port := uint16(lo + (start+i*step)%span)
				pkt, err := bl.Build(b.Proto, netip.AddrPortFrom(b.Src, port), b.VIP, tag<<24|uint32(i)&0xffffff)
				if err == nil {
					err = s.Send(pkt, b.VIP.Addr())
				}
				if err != nil {
					errs[w] = err
					return
				}
				sent[w]++
			}
		}(w, s)
	}
	wg.Wait()
	total := 0
	for _, n := range sent {
		total += n
	}
	p.mu.Lock()
	p.sentTotal += total
	p.sendTime += time.Since(start0)
	p.mu.Unlock()
	return total, errors.Join(errs...)
}

// sender returns the w-th raw socket of a client, opening it on first use.
func (p *Prober) sender(c *netns.Client, w int) (*traffic.Sender, error) {
	if w == 0 {
		return p.senders[c], nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.extra[c]; s != nil {
		return s, nil
	}
	var s *traffic.Sender
	if err := c.NS.Do(func() (err error) { s, err = traffic.OpenSender(); return }); err != nil {
		return nil, fmt.Errorf("client %s: %w", c.NS.Name, err)
	}
	p.extra[c] = s
	return s, nil
}

// Rate returns the probes sent and the time spent sending them.
func (p *Prober) Rate() (int, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sentTotal, p.sendTime
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Counts is what a phase observed.
type Counts struct {
	Arrivals map[Key]int
	Rejects  map[netip.Addr]int
	// OtherICMP counts destination-unreachable errors other than port
	// unreachable (network or host unreachable: a packet nobody handled).
	OtherICMP int
	Seen      int
	Foreign   int
}

// PerEndpoint sums arrivals by endpoint.
func (c Counts) PerEndpoint() map[netip.AddrPort]int {
	out := map[netip.AddrPort]int{}
	for k, v := range c.Arrivals {
		out[k.Endpoint] += v
	}
	return out
}

// Rejected sums rejects over clients.
func (c Counts) Rejected() int {
	n := 0
	for _, v := range c.Rejects {
		n += v
	}
	return n
}

// Collect waits until expected packets were seen (arrivals plus rejects),
// or nothing new arrived for a quiet period (the rest were dropped), bounded
// in time, and returns a copy of the counts.
func (p *Prober) Collect(expected int) Counts {
	deadline := time.Now().Add(maxCollectWait)
	p.mu.Lock()
	last, lastChange := p.seen, time.Now()
	for p.seen < expected && time.Now().Before(deadline) {
		if p.seen != last {
			last, lastChange = p.seen, time.Now()
		} else if time.Since(lastChange) > quietPeriod {
			break
		}
		// Wake up at least every 20 ms to check the clocks.
		t := time.AfterFunc(20*time.Millisecond, func() { p.mu.Lock(); p.cond.Broadcast(); p.mu.Unlock() })
		p.cond.Wait()
		t.Stop()
	}
	c := Counts{Arrivals: make(map[Key]int, len(p.arrivals)), Rejects: make(map[netip.Addr]int, len(p.rejects)), Seen: p.seen, Foreign: p.foreign}
	for k, v := range p.arrivals {
		c.Arrivals[k] = v
	}
	for k, v := range p.rejects {
		c.Rejects[k] = v
	}
	for _, v := range p.icmpElse {
		c.OtherICMP += v
	}
	p.mu.Unlock()
	return c
}
