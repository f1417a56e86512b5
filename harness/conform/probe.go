package conform

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/harness/traffic"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Prober sends probes from client pod namespaces and counts what the
// backend namespaces receive and what rejects reach the clients. Probes
// carry a phase tag in their ID so that a late packet from an earlier phase
// is never counted in a later one.
type Prober struct {
	topo *netns.Topology
	// senders and extra are keyed by the client's namespace: a host
	// client is its node's namespace, and a probe from outside names its
	// entry node in a copy of the client (Probe.Client).
	senders map[*netns.Namespace]*traffic.Sender
	extra   map[*netns.Namespace]*traffic.Sender
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
	// The phase's own figures (reset by Phase).
	phaseSent  int
	arrived    int
	sendErrors int
	dropBase   uint64
	indep      Independence
	// trace, when set (Trace), sees every arrival and ICMP error of the
	// phase as it is counted: the established-flow checks follow one flow
	// packet by packet.
	trace func(traced)

	// Flush empties the conntrack tables of every node namespace; Send
	// calls it between the blocks of a batch. NewProber sets it to
	// `conntrack -F` in each node namespace of the topology; a suite may
	// replace it with its own.
	Flush func() error
	// Entries counts the connections that hold a probe's NAT decision on
	// the client's node, and EntriesName says what it counts (for the
	// report). Send calls it before a block with base and floor 0, and
	// after it with the value before and the block's arrivals: a counter
	// the kernel publishes late may wait (bounded) until floor new ones
	// appear. NewProber sets them to the node namespace's
	// net.netfilter.nf_conntrack_count, or, where the nodes run IPVS, to
	// IPVS's total of scheduled connections (see counterIPVS).
	Entries     func(c *netns.Client, base, floor int64) (int64, error)
	EntriesName string
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
	// maxSendErrors bounds the probes a block may fail to write (ENOBUFS
	// for too long) before the batch stops.
	maxSendErrors = 1000
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

// senderClients are the clients a prober sends from: every client pod
// (endpoint pods included), every client outside the cluster and every
// node's own namespace (host clients).
func senderClients(t *netns.Topology) []*netns.Client {
	out := slices.Clone(t.Clients())
	out = append(out, t.Outside()...)
	return append(out, t.Hosts()...)
}

// NewProber opens the raw sockets: a sender and an ICMP observer in each
// client namespace (pods, clients outside the cluster and the nodes' own
// namespaces for host clients), an observer for TCP and UDP in each backend
// namespace and in each endpoint pod's. It refuses to run without a
// topology of its own.
func NewProber(ctx context.Context, t *netns.Topology) (*Prober, error) {
	if t == nil || len(t.Clients())+len(t.Outside()) == 0 {
		return nil, errors.New("probes are sent only from client namespaces this run created; the scenario has none")
	}
	p := &Prober{topo: t, senders: map[*netns.Namespace]*traffic.Sender{}, extra: map[*netns.Namespace]*traffic.Sender{}, arrivals: map[Key]int{}, rejects: map[netip.Addr]int{}, icmpElse: map[uint8]int{}}
	p.cond = sync.NewCond(&p.mu)
	for _, c := range senderClients(t) {
		var s *traffic.Sender
		err := c.NS.Do(func() (err error) { s, err = traffic.OpenSender(); return })
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("client %s: %w", c.NS.Name, err)
		}
		p.senders[c.NS] = s
		var o *traffic.Observer
		if err := c.NS.Do(func() (err error) { o, err = traffic.OpenObserver(unix.IPPROTO_ICMP); return }); err != nil {
			p.Close()
			return nil, fmt.Errorf("client %s: %w", c.NS.Name, err)
		}
		p.obs = append(p.obs, o)
	}
	nICMP := len(p.obs)
	arrivalsIn := map[*netns.Namespace]string{}
	var order []*netns.Namespace
	for _, n := range t.Nodes() {
		arrivalsIn[n.Backends] = "backends of " + n.Config.Name
		order = append(order, n.Backends)
	}
	for _, c := range t.Clients() {
		if !c.Config.Endpoint {
			continue
		}
		arrivalsIn[c.NS] = "endpoint pod " + c.NS.Name
		order = append(order, c.NS)
		// A connection a pod sends to itself through its Service comes
		// back with its own address as the source when the node does not
		// masquerade it: the kernel would drop it as a martian, and the
		// loss would look like an observer's miss (the node decided it).
		// Accepted, it arrives and its source fails the hairpin check.
		// (accept_local is or-ed over "all" and the interface.)
		if err := c.NS.Sysctl("net.ipv4.conf.all.accept_local", "1"); err != nil {
			p.Close()
			return nil, fmt.Errorf("endpoint pod %s: %w", c.NS.Name, err)
		}
	}
	for _, ns := range order {
		// Backends answer probes in the kernel (a RST, or ICMP port
		// unreachable for UDP); those answers only cost the path back through
		// the node's conntrack. Drop them at the source, in the backend
		// namespace (ours): the node's conntrack entries then stay in
		// SYN_SENT until the phase's flush.
		for _, rule := range replyDrops {
			args := append([]string{"-w", "-A"}, rule...)
			if out, err := ns.Exec("iptables-nft", args...); err != nil {
				p.Close()
				return nil, fmt.Errorf("%s: could not silence replies: %w: %s", arrivalsIn[ns], err, out)
			}
		}
		var o *traffic.Observer
		if err := ns.Do(func() (err error) { o, err = traffic.OpenObserver(unix.IPPROTO_TCP, unix.IPPROTO_UDP); return }); err != nil {
			p.Close()
			return nil, fmt.Errorf("%s: %w", arrivalsIn[ns], err)
		}
		p.obs = append(p.obs, o)
	}
	p.Flush = p.flushNodes
	p.Entries, p.EntriesName = p.nodeEntries, counterConntrack
	if ns := t.Nodes(); len(ns) > 0 && usesIPVS(ns[0].NS) {
		p.Entries, p.EntriesName = p.nodeIPVSEntries, counterIPVS
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
		if p.trace != nil {
			p.trace(traced{At: time.Now(), ID: a.ID, Src: a.Src, Endpoint: a.Dst})
		}
		p.arrivals[Key{a.Dst, a.Src.Addr()}]++
		p.seen++
		p.arrived++
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
		if p.trace != nil {
			p.trace(traced{At: time.Now(), Src: u.Src, Reject: true, Code: u.Code})
		}
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

// traced is one packet of a traced phase: an arrival at an endpoint, or an
// ICMP error a client received (Reject; Code is its code).
type traced struct {
	At       time.Time
	ID       uint32
	Src      netip.AddrPort
	Endpoint netip.AddrPort
	Reject   bool
	Code     uint8
}

// Trace makes f see every packet of the current and later phases (nil
// stops it). f runs with the prober's lock held: it must not call back.
func (p *Prober) Trace(f func(traced)) {
	p.mu.Lock()
	p.trace = f
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
	p.phaseSent, p.arrived, p.sendErrors = 0, 0, 0
	p.indep = Independence{}
	p.mu.Unlock()
	d := p.observerDrops()
	p.mu.Lock()
	p.dropBase = d
	p.mu.Unlock()
}

// observerDrops sums the kernel's drop counters of every observer socket.
func (p *Prober) observerDrops() uint64 {
	var d uint64
	for _, o := range p.obs {
		d += o.Drops()
	}
	return d
}

// ObserverBuffers says how each observer's receive buffers were set (a
// debug figure: SO_RCVBUFFORCE, or SO_RCVBUF capped by rmem_max).
func (p *Prober) ObserverBuffers() []string {
	var out []string
	for _, o := range p.obs {
		out = append(out, o.Buffer())
	}
	return out
}

// flushNodes runs `conntrack -F` in every node namespace of the topology.
func (p *Prober) flushNodes() error {
	var errs []error
	for _, n := range p.topo.Nodes() {
		if _, err := n.NS.Exec("conntrack", "-F"); err != nil {
			errs = append(errs, fmt.Errorf("could not flush the conntrack table of node %s: %w", n.Config.Name, err))
		}
	}
	return errors.Join(errs...)
}

// deciders are the node namespaces that decide a client's connections:
// its node (a pod's, a host client's, or the entry node a probe from
// outside names), or every node for a client outside the cluster whose
// connections a load balancer spreads.
func (p *Prober) deciders(c *netns.Client) ([]*netns.Node, error) {
	if c.Node == "" && c.Where == cluster.Outside {
		return p.topo.Nodes(), nil
	}
	n, ok := p.topo.Node(c.Node)
	if !ok {
		return nil, fmt.Errorf("client %s: no node namespace %q", c.NS.Name, c.Node)
	}
	return []*netns.Node{n}, nil
}

// nodeEntries sums nf_conntrack_count over the client's deciding nodes.
func (p *Prober) nodeEntries(c *netns.Client, _, _ int64) (int64, error) {
	ns, err := p.deciders(c)
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, n := range ns {
		v, err := conntrackCount(n.NS)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

// nodeIPVSEntries reads IPVS's connection total summed over the client's
// deciding node namespaces, waiting (bounded) for the estimators to publish
// floor new ones since base.
func (p *Prober) nodeIPVSEntries(c *netns.Client, base, floor int64) (int64, error) {
	ns, err := p.deciders(c)
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(ipvsStatsWait)
	for {
		var sum int64
		for _, n := range ns {
			v, err := ipvsConns(n.NS)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		if sum-base >= floor || time.Now().After(deadline) {
			return sum, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Probe is one batch: n new connections from one client address to a
// Service, each with a fresh random source port.
type Probe struct {
	Client *netns.Client
	Src    netip.Addr
	// Sources, when set, replaces Src: block i of the batch is sent from
	// Sources[i mod len(Sources)]. With at least as many addresses as
	// blocks no 5-tuple repeats anywhere in the batch, which also holds
	// where a flush cannot clear the old decisions: IPVS keeps its own
	// connection table, and a connection whose reset was lost stays in
	// SYN_RECV for 60 s, where a repeated tuple follows it.
	Sources []netip.Addr
	VIP     netip.AddrPort
	Proto   traffic.Proto
	N       int
	// Gap, when set, is the pause before each probe after the batch's
	// first: rejects paced under the nodes' ICMP rate limit. Only the
	// cluster machine sets it (suite.rejectGap); the namespace run lifts
	// its nodes' limits instead.
	Gap time.Duration
}

// source is the address block i is sent from.
func (b Probe) source(i int) netip.Addr {
	if len(b.Sources) > 0 {
		return b.Sources[i%len(b.Sources)]
	}
	return b.Src
}

// Send writes a batch and returns the number sent. The batch is split into
// blocks of at most MaxBlockProbes probes (planBlocks), each a walk of its
// own through the source ports with a random start and stride, so no port
// repeats inside a block. A batch of more than one probe is counted: before
// each of its blocks Send empties the nodes' conntrack tables (Flush; the
// earlier probes were accounted for, as Collect waits for them), so no probe
// meets a live entry of an earlier one, and after each block it counts the
// new entries on the client's node (Entries) against the block's probes and
// arrivals; Collect returns the proof (Counts.Independence). A batch of one
// probe (affinity rounds) is neither flushed nor counted. A block that
// disproves independence, or a batch whose blocks could not fit in the
// kernel's conntrack table, is an *EnvironmentError. Large blocks are
// written by two goroutines, each on a socket of its own, interleaving the
// same walk.
func (p *Prober) Send(ctx context.Context, b Probe, r *rand.Rand) (int, error) {
	if p.senders[b.Client.NS] == nil {
		return 0, fmt.Errorf("no sender for client %s", b.Client.NS.Name)
	}
	if b.N > maxProbesPerPhase {
		return 0, fmt.Errorf("%d probes exceed the bound of %d per phase", b.N, maxProbesPerPhase)
	}
	blocks := planBlocks(b.N, r)
	counted := b.N > 1
	if counted {
		if err := p.fits(b.Client, blocks); err != nil {
			return 0, err
		}
		restore, err := p.holdEntries()
		defer restore()
		if err != nil {
			return 0, err
		}
	}
	p.mu.Lock()
	tag := p.tag
	p.mu.Unlock()
	var sending time.Duration // the generator's own time, flushes and counts left out
	var proof Independence
	total := 0
	var err error
	for i, bl := range blocks {
		// Every counted block starts from empty tables: it then meets no
		// entry of an earlier block or batch, and an entry of an earlier
		// batch cannot expire during the block and hide a new one.
		if counted {
			if err = p.Flush(); err != nil {
				err = &EnvironmentError{fmt.Errorf("before probe block %d: %w", i+1, err)}
				break
			}
		}
		var base int64
		var arrivedBase int
		if counted {
			if base, err = p.Entries(b.Client, 0, 0); err != nil {
				err = &EnvironmentError{fmt.Errorf("could not count conntrack entries before block %d: %w", i+1, err)}
				break
			}
			p.mu.Lock()
			arrivedBase = p.arrived
			p.mu.Unlock()
		}
		var n int
		t0 := time.Now()
		n, err = p.sendBlock(ctx, b, b.source(i), bl, tag)
		sending += time.Since(t0)
		total += n
		if err != nil {
			break
		}
		if !counted {
			proof.Single += n
			continue
		}
		var entries int64
		var arrived int
		if entries, arrived, err = p.countBlock(b.Client, base, arrivedBase); err != nil {
			err = &EnvironmentError{fmt.Errorf("could not count conntrack entries after block %d: %w", i+1, err)}
			break
		}
		proof.Blocks++
		proof.Probes += n
		proof.Entries += entries
		proof.Arrived += arrived
		if msg := blockProof(i, n, arrived, entries, p.EntriesName); msg != "" {
			proof.Problems = append(proof.Problems, msg)
		}
	}
	proof.Counter = p.EntriesName
	p.mu.Lock()
	p.sentTotal += total
	p.sendTime += sending
	p.indep.add(proof)
	p.mu.Unlock()
	if err == nil && !proof.Holds() {
		err = &EnvironmentError{fmt.Errorf("probes were not independent draws: %s", strings.Join(proof.Problems, "; "))}
	}
	return total, err
}

// entryTimeouts are the conntrack timeouts (seconds) that could end a
// probe's entry before its block is counted: an unanswered UDP probe (30 s;
// in the microVM a block takes 10 to 20 s) and a TCP connection whose reset
// got through (CLOSE, 10 s). SYN_SENT (120 s, the resets are dropped in
// iptables and nftables modes) outlasts any block. IPVS mode does not count
// conntrack entries at all (see counterIPVS).
var entryTimeouts = []string{"net.netfilter.nf_conntrack_tcp_timeout_close", "net.netfilter.nf_conntrack_udp_timeout"}

// holdTimeout is what holdEntries raises them to.
const holdTimeout = 600

// holdEntries raises entryTimeouts in every node namespace (per-namespace
// sysctls) to holdTimeout while a batch is sent and counted, so that the
// count is not shortened by entries that expire during a block, and
// returns the function that puts the old values back. It changes nothing
// the checks observe: the probes' entries are flushed before the next
// counted block and between phases, and no check waits for their expiry.
func (p *Prober) holdEntries() (restore func(), err error) {
	type old struct {
		ns  *netns.Namespace
		key string
		val string
	}
	var olds []old
	restore = func() {
		for _, o := range olds {
			_ = o.ns.Sysctl(o.key, o.val)
		}
	}
	for _, n := range p.topo.Nodes() {
		for _, k := range entryTimeouts {
			v, err := n.NS.ReadSysctl(k)
			if err != nil {
				return restore, &EnvironmentError{fmt.Errorf("node %s: %w", n.Config.Name, err)}
			}
			if cur, err := strconv.Atoi(v); err == nil && cur >= holdTimeout {
				continue
			}
			if err := n.NS.Sysctl(k, strconv.Itoa(holdTimeout)); err != nil {
				return restore, &EnvironmentError{fmt.Errorf("node %s: %w", n.Config.Name, err)}
			}
			olds = append(olds, old{n.NS, k, v})
		}
	}
	return restore, nil
}

// countBlock waits until the phase's probes are accounted for, then returns
// the new entries and arrivals since the block began.
func (p *Prober) countBlock(c *netns.Client, base int64, arrivedBase int) (int64, int, error) {
	p.mu.Lock()
	p.await(p.phaseSent)
	arrived := p.arrived - arrivedBase
	p.mu.Unlock()
	after, err := p.Entries(c, base, int64(arrived))
	return after - base, arrived, err
}

// fits refuses blocks that the kernel's conntrack table could not hold: a
// probe makes an entry in the client's node and, for an endpoint on another
// node, one more there. Send empties the tables before each block, so the
// largest block is what must fit under nf_conntrack_max (one value for the
// whole kernel, read from the node's namespace).
func (p *Prober) fits(c *netns.Client, blocks []block) error {
	ns, err := p.deciders(c)
	if err != nil {
		return err
	}
	v, err := ns[0].NS.ReadSysctl("net.netfilter.nf_conntrack_max")
	if err != nil {
		return nil // no limit to compare with; the count after each block reports the rest
	}
	limit, err := strconv.ParseInt(v, 10, 64)
	if err != nil || limit <= 0 {
		return nil
	}
	perProbe := int64(min(2, len(p.topo.Nodes())))
	largest := 0
	for _, bl := range blocks {
		largest = max(largest, bl.N)
	}
	if need := int64(largest) * perProbe; need > limit {
		return &EnvironmentError{fmt.Errorf("a block of %d probes needs up to %d conntrack entries, more than this kernel's net.netfilter.nf_conntrack_max %d: raise it (sysctl -w net.netfilter.nf_conntrack_max=%d)",
			largest, need, limit, 2*need)}
	}
	return nil
}

// sendBlock writes one block from src: probe j has the block's j-th source port and
// the ID tag<<24 | (First+j). A probe that could not be written for a full
// queue is counted (Counts.SendErrors) and skipped; more than maxSendErrors
// of them, or any other error, stop the block.
func (p *Prober) sendBlock(ctx context.Context, b Probe, src netip.Addr, bl block, tag uint32) (int, error) {
	sinks := []traffic.PacketSink{}
	for w := range min(2, 1+bl.N/2000) {
		s, err := p.sender(b.Client, w)
		if err != nil {
			return 0, err
		}
		sinks = append(sinks, s)
	}
	total, nfail, err := traffic.SendWalk(ctx, traffic.Walk{Proto: b.Proto, Src: src, Dst: b.VIP, N: bl.N, Start: bl.Start, Step: bl.Step,
		ID:            func(j int) uint32 { return tag<<24 | uint32(bl.First+j)&0xffffff },
		Deadline:      time.Now().Add(timeScaled(time.Duration(bl.N)*50*time.Microsecond + 10*time.Second)),
		MaxSendErrors: maxSendErrors}, sinks)
	p.mu.Lock()
	p.phaseSent += total
	p.sendErrors += nfail
	p.mu.Unlock()
	return total, err
}

// sender returns the w-th raw socket of a client, opening it on first use.
func (p *Prober) sender(c *netns.Client, w int) (*traffic.Sender, error) {
	if w == 0 {
		return p.senders[c.NS], nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.extra[c.NS]; s != nil {
		return s, nil
	}
	var s *traffic.Sender
	if err := c.NS.Do(func() (err error) { s, err = traffic.OpenSender(); return }); err != nil {
		return nil, fmt.Errorf("client %s: %w", c.NS.Name, err)
	}
	p.extra[c.NS] = s
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
	// Sent is the probes the phase's batches wrote; SendErrors the probes
	// they could not write (a full queue for too long).
	Sent       int
	SendErrors int
	// ObserverDrops is the packets the observers' sockets dropped during
	// the phase (every observer's kernel drop counter, delta over the
	// phase): probes the kernel delivered that nobody counted.
	ObserverDrops uint64
	// Independence is the proof that the phase's probes were fresh NAT
	// decisions (see Send).
	Independence Independence
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
	p.mu.Lock()
	p.await(expected)
	c := Counts{Arrivals: make(map[Key]int, len(p.arrivals)), Rejects: make(map[netip.Addr]int, len(p.rejects)), Seen: p.seen, Foreign: p.foreign,
		Sent: p.phaseSent, SendErrors: p.sendErrors, Independence: p.indep}
	c.Independence.Problems = slices.Clone(p.indep.Problems)
	for k, v := range p.arrivals {
		c.Arrivals[k] = v
	}
	for k, v := range p.rejects {
		c.Rejects[k] = v
	}
	for _, v := range p.icmpElse {
		c.OtherICMP += v
	}
	base := p.dropBase
	p.mu.Unlock()
	if d := p.observerDrops(); d > base {
		c.ObserverDrops = d - base
	}
	return c
}

// await waits, with p.mu held, until expected packets of the phase were
// seen, or nothing new arrived for quietPeriod, at most maxCollectWait.
func (p *Prober) await(expected int) {
	deadline := time.Now().Add(maxCollectWait)
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
}
