package ipvs

// Fake is a behavioural model of the kernel's IPVS table, in the spirit of
// knftables.Fake: it keeps virtual servers and real servers as the kernel
// does (a new real server goes to the head of its service's list, as
// list_add_rcu puts it), answers with the kernel's errors, and can schedule
// a new connection with the weight-aware schedulers (rr, wrr, lc, wlc, sed,
// nq) so that tests see what a weight or a missing real server does. The
// hash schedulers (sh, dh, mh) and persistence templates are not modelled:
// Schedule refuses them; the VM conformance suite checks them on a kernel.

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"

	libipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"
)

// Protocol numbers as IPVS uses them.
const (
	protoTCP  = syscall.IPPROTO_TCP
	protoUDP  = syscall.IPPROTO_UDP
	protoSCTP = 132
)

// Key identifies a virtual server as the kernel does: protocol, address and
// port.
type Key struct {
	Proto string // "TCP", "UDP" or "SCTP"
	Addr  netip.Addr
	Port  uint16
}

// String is "TCP 10.96.0.10:80".
func (k Key) String() string {
	return k.Proto + " " + netip.AddrPortFrom(k.Addr, k.Port).String()
}

// Compare orders keys by protocol, address, port.
func (k Key) Compare(o Key) int {
	if c := strings.Compare(k.Proto, o.Proto); c != 0 {
		return c
	}
	if c := k.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	return cmp.Compare(k.Port, o.Port)
}

// KeyOf is the key of a libipvs service.
func KeyOf(s *libipvs.Service) Key {
	a, _ := netip.AddrFromSlice(s.Address)
	return Key{Proto: protoName(s.Protocol), Addr: a.Unmap(), Port: s.Port}
}

func protoName(p uint16) string {
	switch p {
	case protoTCP:
		return "TCP"
	case protoUDP:
		return "UDP"
	case protoSCTP:
		return "SCTP"
	}
	return fmt.Sprintf("proto-%d", p)
}

func protoNumber(name string) uint16 {
	switch name {
	case "TCP":
		return protoTCP
	case "UDP":
		return protoUDP
	case "SCTP":
		return protoSCTP
	}
	return 0
}

// ErrNoDestination is returned by Fake.Schedule when no real server is
// available: the kernel then answers the client with ICMP port unreachable
// (ip_vs_leave).
var ErrNoDestination = errors.New("no destination available")

// ErrNotModelled is returned by Fake.Schedule for the hash schedulers.
var ErrNotModelled = errors.New("scheduler not modelled by the fake")

type fakeDest struct {
	d       libipvs.Destination
	active  int
	inact   int
	conns   uint32 // live statistics
	pktsIn  uint32
	bytesIn uint64
	pub     libipvs.DstStats // published statistics
}

type fakeService struct {
	s     libipvs.Service
	dests []*fakeDest // list order: newest first
	// scheduler state
	rrLast *fakeDest
	wrrI   int
	wrrCW  int
	pub    libipvs.SvcStats
	conns  uint32
	pkts   uint32
	bytes  uint64
}

// Fake implements Interface in memory. It is safe for concurrent use.
type Fake struct {
	mu       sync.Mutex
	services map[Key]*fakeService
	config   libipvs.Config
	// Lag keeps statistics unpublished until Publish is called, as the
	// kernel's estimator publishes them every 2 seconds; false publishes
	// at once.
	Lag bool
	// Calls counts the calls that change the table, by method name.
	Calls map[string]int
}

var _ Interface = (*Fake)(nil)

// NewFake returns an empty table.
func NewFake() *Fake {
	return &Fake{services: map[Key]*fakeService{}, Calls: map[string]int{}}
}

func (f *Fake) count(m string) { f.Calls[m]++ }

func (f *Fake) lookup(s *libipvs.Service) (*fakeService, error) {
	fs := f.services[KeyOf(s)]
	if fs == nil {
		return nil, fmt.Errorf("service %s: %w", KeyOf(s), unix.ESRCH)
	}
	return fs, nil
}

func checkService(s *libipvs.Service) error {
	if protoNumber(protoName(s.Protocol)) == 0 {
		return fmt.Errorf("protocol %d: %w", s.Protocol, unix.EPROTONOSUPPORT)
	}
	if !slices.Contains(Schedulers, s.SchedName) {
		return fmt.Errorf("scheduler %q: %w", s.SchedName, unix.ENOENT)
	}
	if a, ok := netip.AddrFromSlice(s.Address); !ok || !a.Unmap().Is4() {
		return fmt.Errorf("address %v: %w", s.Address, unix.EAFNOSUPPORT)
	}
	return nil
}

// GetServices lists the virtual servers, sorted by key, with their
// published statistics; the kernel sets FlagHashed on each.
func (f *Fake) GetServices() ([]*libipvs.Service, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*libipvs.Service, 0, len(f.services))
	for _, k := range f.sortedKeys() {
		fs := f.services[k]
		s := fs.s
		s.Address = slices.Clone(s.Address)
		s.Flags |= FlagHashed
		s.Stats = fs.pub
		out = append(out, &s)
	}
	return out, nil
}

func (f *Fake) sortedKeys() []Key {
	keys := make([]Key, 0, len(f.services))
	for k := range f.services {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, Key.Compare)
	return keys
}

// NewService adds a virtual server (EEXIST if it exists, ENOENT for an
// unknown scheduler).
func (f *Fake) NewService(s *libipvs.Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count("NewService")
	if err := checkService(s); err != nil {
		return err
	}
	k := KeyOf(s)
	if f.services[k] != nil {
		return fmt.Errorf("service %s: %w", k, unix.EEXIST)
	}
	c := *s
	c.Address = slices.Clone(s.Address)
	c.Flags &^= FlagHashed
	f.services[k] = &fakeService{s: c, wrrI: -1}
	return nil
}

// UpdateService changes scheduler, flags and timeout (ESRCH if missing).
func (f *Fake) UpdateService(s *libipvs.Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count("UpdateService")
	if err := checkService(s); err != nil {
		return err
	}
	fs, err := f.lookup(s)
	if err != nil {
		return err
	}
	if fs.s.SchedName != s.SchedName {
		fs.rrLast, fs.wrrI, fs.wrrCW = nil, -1, 0
	}
	fs.s.SchedName, fs.s.Flags, fs.s.Timeout, fs.s.Netmask = s.SchedName, s.Flags&^FlagHashed, s.Timeout, s.Netmask
	return nil
}

// DelService removes a virtual server (ESRCH if missing).
func (f *Fake) DelService(s *libipvs.Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count("DelService")
	if _, err := f.lookup(s); err != nil {
		return err
	}
	delete(f.services, KeyOf(s))
	return nil
}

// Flush removes every virtual server.
func (f *Fake) Flush() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count("Flush")
	clear(f.services)
	return nil
}

func destKey(d *libipvs.Destination) netip.AddrPort {
	a, _ := netip.AddrFromSlice(d.Address)
	return netip.AddrPortFrom(a.Unmap(), d.Port)
}

func (fs *fakeService) find(d *libipvs.Destination) (int, *fakeDest) {
	k := destKey(d)
	for i, x := range fs.dests {
		if destKey(&x.d) == k {
			return i, x
		}
	}
	return -1, nil
}

// GetDestinations lists a service's real servers in list order, with their
// connection counts and published statistics.
func (f *Fake) GetDestinations(s *libipvs.Service) ([]*libipvs.Destination, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fs, err := f.lookup(s)
	if err != nil {
		return nil, err
	}
	out := make([]*libipvs.Destination, 0, len(fs.dests))
	for _, x := range fs.dests {
		d := x.d
		d.Address = slices.Clone(d.Address)
		d.ActiveConnections, d.InactiveConnections = x.active, x.inact
		d.Stats = x.pub
		out = append(out, &d)
	}
	return out, nil
}

// NewDestination adds a real server at the head of the list (EEXIST if it
// exists, ESRCH if the service does not, ERANGE for a negative weight).
func (f *Fake) NewDestination(s *libipvs.Service, d *libipvs.Destination) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count("NewDestination")
	fs, err := f.lookup(s)
	if err != nil {
		return err
	}
	if d.Weight < 0 {
		return fmt.Errorf("weight %d: %w", d.Weight, unix.ERANGE)
	}
	if _, x := fs.find(d); x != nil {
		return fmt.Errorf("destination %s: %w", destKey(d), unix.EEXIST)
	}
	c := *d
	c.Address = slices.Clone(d.Address)
	fs.dests = slices.Insert(fs.dests, 0, &fakeDest{d: c})
	fs.wrrI, fs.wrrCW = -1, 0
	return nil
}

// UpdateDestination changes a real server's weight (ENOENT if missing).
func (f *Fake) UpdateDestination(s *libipvs.Service, d *libipvs.Destination) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count("UpdateDestination")
	fs, err := f.lookup(s)
	if err != nil {
		return err
	}
	if d.Weight < 0 {
		return fmt.Errorf("weight %d: %w", d.Weight, unix.ERANGE)
	}
	_, x := fs.find(d)
	if x == nil {
		return fmt.Errorf("destination %s: %w", destKey(d), unix.ENOENT)
	}
	x.d.Weight = d.Weight
	fs.wrrI, fs.wrrCW = -1, 0
	return nil
}

// DelDestination removes a real server (ENOENT if missing). Its
// connections go with it here; in the kernel they linger in the trash.
func (f *Fake) DelDestination(s *libipvs.Service, d *libipvs.Destination) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count("DelDestination")
	fs, err := f.lookup(s)
	if err != nil {
		return err
	}
	i, x := fs.find(d)
	if x == nil {
		return fmt.Errorf("destination %s: %w", destKey(d), unix.ENOENT)
	}
	if fs.rrLast == x {
		// ip_vs_rr_del_dest steps back to the previous entry (the list
		// head for the first one), so the rotation goes on with the next.
		fs.rrLast = nil
		if i > 0 {
			fs.rrLast = fs.dests[i-1]
		}
	}
	fs.dests = slices.Delete(fs.dests, i, i+1)
	fs.wrrI, fs.wrrCW = -1, 0
	return nil
}

// SetConfig records the timeouts.
func (f *Fake) SetConfig(c *libipvs.Config) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count("SetConfig")
	f.config = *c
	return nil
}

// Config returns the timeouts last set.
func (f *Fake) Config() libipvs.Config {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.config
}

// Close does nothing.
func (f *Fake) Close() {}

// SetConnections sets a real server's active and inactive connection
// counts, as traffic would (graceful termination waits for both to reach
// zero).
func (f *Fake) SetConnections(k Key, dst netip.AddrPort, active, inactive int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	fs := f.services[k]
	if fs == nil {
		return fmt.Errorf("service %s: %w", k, unix.ESRCH)
	}
	for _, x := range fs.dests {
		if destKey(&x.d) == dst {
			x.active, x.inact = active, inactive
			return nil
		}
	}
	return fmt.Errorf("destination %s: %w", dst, unix.ENOENT)
}

// Publish copies the live statistics to the published ones, as the
// kernel's estimator timer does every 2 seconds.
func (f *Fake) Publish() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.publish()
}

func (f *Fake) publish() {
	for _, fs := range f.services {
		fs.pub.Connections, fs.pub.PacketsIn, fs.pub.BytesIn = fs.conns, fs.pkts, fs.bytes
		for _, x := range fs.dests {
			x.pub.Connections, x.pub.PacketsIn, x.pub.BytesIn = x.conns, x.pktsIn, x.bytesIn
		}
	}
}

// Totals returns the live connection and incoming packet totals of the
// table (the kernel's /proc/net/ip_vs_stats_percpu, summed).
func (f *Fake) Totals() (conns, pkts uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, fs := range f.services {
		conns += uint64(fs.conns)
		pkts += uint64(fs.pkts)
	}
	return conns, pkts
}

// Schedule models the first packet of a new connection to the virtual
// server k: the scheduler picks a real server (the connection then counts
// as inactive, as a SYN does), and the statistics grow by one connection
// and one packet of size bytes. It returns ErrNoDestination when no real
// server is available and ErrNotModelled for sh, dh and mh.
func (f *Fake) Schedule(k Key, bytes int) (netip.AddrPort, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fs := f.services[k]
	if fs == nil {
		return netip.AddrPort{}, fmt.Errorf("service %s: %w", k, unix.ESRCH)
	}
	var x *fakeDest
	switch fs.s.SchedName {
	case "rr":
		x = fs.rr()
	case "wrr":
		x = fs.wrr()
	case "lc", "wlc", "sed", "nq":
		x = fs.leastConn(fs.s.SchedName)
	default:
		return netip.AddrPort{}, fmt.Errorf("%s: %w", fs.s.SchedName, ErrNotModelled)
	}
	if x == nil {
		return netip.AddrPort{}, fmt.Errorf("service %s: %w", k, ErrNoDestination)
	}
	x.inact++
	x.conns++
	x.pktsIn++
	x.bytesIn += uint64(bytes)
	fs.conns++
	fs.pkts++
	fs.bytes += uint64(bytes)
	if !f.Lag {
		f.publish()
	}
	return destKey(&x.d), nil
}

func available(x *fakeDest) bool { return x.d.Weight > 0 }

// rr is ip_vs_rr.c: the next available real server after the last one
// chosen, in list order.
func (fs *fakeService) rr() *fakeDest {
	n := len(fs.dests)
	start := -1
	if fs.rrLast != nil {
		start = slices.Index(fs.dests, fs.rrLast)
	}
	for i := 1; i <= n; i++ {
		x := fs.dests[(start+i+n)%n]
		if available(x) {
			fs.rrLast = x
			return x
		}
	}
	return nil
}

// wrr is the classic weighted round robin of ip_vs_wrr.c: walk the list,
// lowering the current weight by the weights' gcd at each wrap, and pick
// the next real server whose weight reaches it.
func (fs *fakeService) wrr() *fakeDest {
	n := len(fs.dests)
	mw, g := 0, 0
	for _, x := range fs.dests {
		if x.d.Weight > 0 {
			mw = max(mw, x.d.Weight)
			g = gcd(g, x.d.Weight)
		}
	}
	if mw == 0 {
		return nil
	}
	for steps := 0; steps < 2*n*(mw/g+1); steps++ {
		fs.wrrI = (fs.wrrI + 1) % n
		if fs.wrrI == 0 {
			fs.wrrCW -= g
			if fs.wrrCW <= 0 {
				fs.wrrCW = mw
			}
		}
		if x := fs.dests[fs.wrrI]; x.d.Weight >= fs.wrrCW && x.d.Weight > 0 {
			return x
		}
	}
	return nil
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// leastConn is ip_vs_lc.c, ip_vs_wlc.c, ip_vs_sed.c and ip_vs_nq.c: the
// real server with the least overhead (lc and wlc: active*256 + inactive;
// sed and nq: active + 1), weighed by weight except for lc; nq takes an idle
// one at once. Ties go to the first in list order.
func (fs *fakeService) leastConn(sched string) *fakeDest {
	var least *fakeDest
	var loh int64
	for _, x := range fs.dests {
		if !available(x) {
			continue
		}
		var doh int64
		switch sched {
		case "lc", "wlc":
			doh = int64(x.active)<<8 + int64(x.inact)
		default:
			doh = int64(x.active) + 1
		}
		if sched == "nq" && x.active == 0 {
			return x
		}
		switch {
		case least == nil:
			least, loh = x, doh
		case sched == "lc":
			if doh < loh {
				least, loh = x, doh
			}
		default:
			if loh*int64(x.d.Weight) > doh*int64(least.d.Weight) {
				least, loh = x, doh
			}
		}
	}
	return least
}

// Dump prints the table as `ipvsadm -Ln` does, in canonical order:
// services by protocol, address and port, real servers by address and port.
func (f *Fake) Dump() string {
	svcs, _ := f.GetServices()
	var b strings.Builder
	writeHeader(&b)
	for _, s := range svcs {
		ds, _ := f.GetDestinations(s)
		writeService(&b, s, ds)
	}
	return b.String()
}

func writeHeader(b *strings.Builder) {
	b.WriteString("Prot LocalAddress:Port Scheduler Flags\n")
	b.WriteString("  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n")
}

// writeService prints one virtual server and its real servers the way
// ipvsadm -Ln does (persistence as "persistent T", mh's port flag as
// "mh-port"), real servers sorted.
func writeService(b *strings.Builder, s *libipvs.Service, ds []*libipvs.Destination) {
	k := KeyOf(s)
	fmt.Fprintf(b, "%-4s %s %s", k.Proto, net.JoinHostPort(k.Addr.String(), fmt.Sprint(k.Port)), s.SchedName)
	if s.Flags&FlagPersistent != 0 {
		fmt.Fprintf(b, " persistent %d", s.Timeout)
	}
	if s.Flags&FlagSourceHash != 0 {
		switch s.SchedName {
		case "mh", "sh":
			fmt.Fprintf(b, " %s-port", s.SchedName)
		default:
			b.WriteString(" sched2")
		}
	}
	b.WriteString("\n")
	ds = slices.Clone(ds)
	slices.SortFunc(ds, func(a, b *libipvs.Destination) int { return destKey(a).Compare(destKey(b)) })
	for _, d := range ds {
		fmt.Fprintf(b, "  -> %-28s %-7s %-6d %-10d %d\n", destKey(d).String(), fwdName(d.ConnectionFlags), d.Weight, d.ActiveConnections, d.InactiveConnections)
	}
}

func fwdName(flags uint32) string {
	switch flags & libipvs.ConnFwdMask {
	case libipvs.ConnFwdMasq:
		return "Masq"
	case libipvs.ConnFwdLocalNode:
		return "Local"
	case libipvs.ConnFwdTunnel:
		return "Tunnel"
	case libipvs.ConnFwdDirectRoute:
		return "Route"
	}
	return "Bypass"
}
