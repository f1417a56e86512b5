package ipvs

// Backend reconciles one node's kernel with the renderer's Plan, in
// kube-proxy's order (syncProxyRules): the dummy device, the ipsets, each
// virtual server with its address bound and its real servers, the ipset
// entries, the constant iptables rules, then the stale addresses and
// services. Real servers leave gracefully as kube-proxy's
// GracefulTerminationManager makes them: a TCP real server with
// connections is set to weight 0 (no new connections) and deleted once its
// active and inactive connections are gone; UDP and SCTP ones are deleted
// at once (expire_nodest_conn=1 drops their flows on the next packet).
//
// A full sync first reads what the kernel holds (services, real servers,
// addresses, ipset entries); a partial sync diffs the plan against what the
// backend recorded at its last sync, so it touches only what changed.

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	libipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/dataplane/iptables"
	"github.com/kpsim/kpsim/dataplane/netns"
	"github.com/kpsim/kpsim/sim/cluster"
)

// appliedVS is what the backend last programmed for one virtual server.
type appliedVS struct {
	sp        cluster.ServicePortName
	known     bool // sp is known (false for a service found in the kernel only)
	scheduler string
	flags     uint32
	timeout   uint32
	dests     map[netip.AddrPort]int // weight, 0 while terminating
}

// termKey names a real server that is leaving gracefully.
type termKey struct {
	vs   Key
	dest netip.AddrPort
}

// errClosed is returned by every method after Close.
var errClosed = errors.New("the ipvs backend is closed")

// Backend is the IPVS dataplane of one node.
type Backend struct {
	r   *Renderer
	cfg Config
	h   Interface
	sys System
	// closer releases the namespace's sockets (nil for fakes).
	closer func()

	mu          sync.Mutex // serialises every kernel call and the records
	applied     map[Key]*appliedVS
	terminating map[termKey]bool
	bound       map[netip.Addr]bool
	sets        map[string]map[string]bool
	jumps       bool
	jumpsTried  bool // a restore of the jump rules was run (and maybe failed)
	needFull    bool
	initialized bool
	closed      bool
	// LastPlan is the last plan applied (for inspection and tests).
	LastPlan *Plan
	// clock is the time Counters polls in (zero: the real clock).
	clock clock

	drainOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

var _ dataplane.Backend = (*Backend)(nil)

// NewBackend returns a backend that programs the node namespace ns. It
// opens the IPVS and netlink sockets there; Close releases them.
func NewBackend(ns *netns.Namespace, cfg Config) (*Backend, error) {
	n, err := OpenNamespace(ns)
	if err != nil {
		return nil, err
	}
	b, err := New(cfg, n.IPVS(), n)
	if err != nil {
		n.Close()
		return nil, err
	}
	b.closer = n.Close
	return b, nil
}

// New returns a backend over an IPVS handle and a system (real or fake).
func New(cfg Config, h Interface, sys System) (*Backend, error) {
	r, err := NewRenderer(cfg)
	if err != nil {
		return nil, err
	}
	return &Backend{r: r, cfg: r.Config(), h: h, sys: sys, needFull: true,
		applied: map[Key]*appliedVS{}, terminating: map[termKey]bool{}, bound: map[netip.Addr]bool{}, sets: map[string]map[string]bool{},
		stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Tool is the command name of an iptables tool of the configured variant,
// e.g. "iptables-nft-restore".
func (b *Backend) Tool(verb string) string {
	return iptables.Tool(b.cfg.IPTablesVariant, verb)
}

// Sync renders the state and makes the kernel match it. A failure makes the
// next sync full, as kube-proxy does after a failed restore.
func (b *Backend) Sync(st *cluster.State, changed []cluster.ServicePortName, full bool) (dataplane.SyncResult, error) {
	start := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return dataplane.SyncResult{}, errClosed
	}
	full = full || b.needFull
	plan := b.r.Render(st)
	res := dataplane.SyncResult{Full: full, NoLocalEndpoints: plan.NoLocalEndpoints}
	ops, bytes, err := b.apply(plan, full)
	res.Lines = plan.RestoreLines + ops
	res.Bytes = len(plan.Restore) + bytes
	res.Duration = time.Since(start)
	if err != nil {
		b.needFull = true
		return res, err
	}
	b.needFull = false
	b.LastPlan = plan
	b.drainOnce.Do(b.startDrain)
	return res, nil
}

// apply programs a plan; it returns the number of IPVS, address and ipset
// operations and the ipset restore's size.
func (b *Backend) apply(p *Plan, full bool) (int, int, error) {
	ops := 0
	if full || !b.initialized {
		if err := b.initialize(); err != nil {
			return ops, 0, err
		}
	}
	if full {
		if err := b.readKernel(); err != nil {
			return ops, 0, err
		}
	}
	setOps, setText, err := b.syncSets(p, full)
	ops += setOps
	if err != nil {
		return ops, len(setText), err
	}
	for _, vs := range p.Servers {
		n, err := b.syncServer(vs)
		ops += n
		if err != nil {
			return ops, len(setText), err
		}
	}
	if _, err := b.sys.Run(p.Restore, b.Tool("restore"), "--noflush", "--counters"); err != nil {
		return ops, len(setText), fmt.Errorf("could not restore the iptables rules: %w", err)
	}
	if !b.jumps {
		text := JumpRules()
		if b.jumpsTried {
			// A restore of them failed: iptables-restore commits table
			// by table, so some may be there already.
			save, err := b.sys.Run("", b.Tool("save"))
			if err != nil {
				return ops, len(setText), fmt.Errorf("could not read the jump rules: %w", err)
			}
			text = MissingJumpRules(save)
		}
		b.jumpsTried = true
		if _, err := b.sys.Run(text, b.Tool("restore"), "--noflush"); err != nil {
			return ops, len(setText), fmt.Errorf("could not install the jump rules: %w", err)
		}
		b.jumps = true
	}
	// Superfluous addresses, then services that are no longer planned.
	want := map[netip.Addr]bool{}
	for _, a := range p.Bind {
		want[a] = true
	}
	for _, a := range sortedAddrs(b.bound) {
		if !want[a] {
			if err := b.sys.DelAddress(DummyDevice, a); err != nil {
				return ops, len(setText), err
			}
			delete(b.bound, a)
			ops++
		}
	}
	for _, k := range b.appliedKeys() {
		if _, ok := p.Server(k); ok {
			continue
		}
		if err := b.h.DelService(b.service(k, b.applied[k])); err != nil && !IsNotFound(err) {
			return ops, len(setText), fmt.Errorf("could not delete virtual server %s: %w", k, err)
		}
		delete(b.applied, k)
		for t := range b.terminating {
			if t.vs == k {
				delete(b.terminating, t)
			}
		}
		ops++
	}
	n, err := b.drain()
	return ops + n, len(setText), err
}

// initialize sets kube-proxy's sysctls and timeouts and creates the dummy
// device.
func (b *Backend) initialize() error {
	for _, s := range b.sysctls() {
		cur, err := b.sys.ReadSysctl(s.key)
		if err == nil && cur == s.value {
			continue
		}
		if err := b.sys.Sysctl(s.key, s.value); err != nil {
			return fmt.Errorf("could not set sysctl %s: %w", s.key, err)
		}
	}
	if b.cfg.TCPTimeout > 0 || b.cfg.TCPFinTimeout > 0 || b.cfg.UDPTimeout > 0 {
		if err := b.h.SetConfig(&libipvs.Config{TimeoutTCP: b.cfg.TCPTimeout, TimeoutTCPFin: b.cfg.TCPFinTimeout, TimeoutUDP: b.cfg.UDPTimeout}); err != nil {
			return fmt.Errorf("could not set the ipvs timeouts: %w", err)
		}
	}
	if err := b.sys.EnsureDummy(DummyDevice); err != nil {
		return err
	}
	b.initialized = true
	return nil
}

type sysctl struct{ key, value string }

// sysctls are the ones kube-proxy's NewProxier ensures. conn_reuse_mode is
// set to 0 only on kernels from 4.1 to 5.8; from 5.9 (the conntrack
// rescheduling fix, kubernetes#93297) it is left as it is.
func (b *Backend) sysctls() []sysctl {
	out := []sysctl{{"net/ipv4/vs/conntrack", "1"}}
	major, minor := kernelVersion(b.sys.KernelRelease())
	if (major > 4 || major == 4 && minor >= 1) && (major < 5 || major == 5 && minor < 9) {
		out = append(out, sysctl{"net/ipv4/vs/conn_reuse_mode", "0"})
	}
	return append(out,
		sysctl{"net/ipv4/vs/expire_nodest_conn", "1"},
		sysctl{"net/ipv4/vs/expire_quiescent_template", "1"},
		sysctl{"net/ipv4/ip_forward", "1"})
}

// kernelVersion parses "6.1.0-57-amd64" into 6, 1.
func kernelVersion(release string) (int, int) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return 0, 0
	}
	major, _ := strconv.Atoi(parts[0])
	minor, _ := strconv.Atoi(strings.TrimFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	return major, minor
}

// readKernel replaces the records with what the kernel holds: every virtual
// server and real server of the namespace (which is this node's alone) and
// the addresses on the dummy device.
func (b *Backend) readKernel() error {
	svcs, err := b.h.GetServices()
	if err != nil {
		return fmt.Errorf("could not list the virtual servers: %w", err)
	}
	old := b.applied
	b.applied = make(map[Key]*appliedVS, len(svcs))
	for _, s := range svcs {
		k := KeyOf(s)
		ds, err := b.h.GetDestinations(s)
		if err != nil {
			return fmt.Errorf("could not list the real servers of %s: %w", k, err)
		}
		a := &appliedVS{scheduler: s.SchedName, flags: s.Flags &^ FlagHashed, timeout: s.Timeout, dests: make(map[netip.AddrPort]int, len(ds))}
		if o := old[k]; o != nil {
			a.sp, a.known = o.sp, o.known
		}
		for _, d := range ds {
			a.dests[destKey(d)] = d.Weight
		}
		b.applied[k] = a
	}
	for t := range b.terminating {
		if a := b.applied[t.vs]; a == nil {
			delete(b.terminating, t)
		} else if _, ok := a.dests[t.dest]; !ok {
			delete(b.terminating, t)
		}
	}
	addrs, err := b.sys.Addresses(DummyDevice)
	if err != nil {
		return err
	}
	clear(b.bound)
	for _, a := range addrs {
		b.bound[a] = true
	}
	return nil
}

// service is the libipvs form of a virtual server, as kube-proxy's
// toIPVSService builds it (netmask /32 for persistence per client address).
func (b *Backend) service(k Key, a *appliedVS) *libipvs.Service {
	s := &libipvs.Service{Address: k.Addr.AsSlice(), Protocol: protoNumber(k.Proto), Port: k.Port,
		AddressFamily: unix.AF_INET, Netmask: 0xffffffff}
	if a != nil {
		s.SchedName, s.Flags, s.Timeout = a.scheduler, a.flags, a.timeout
	}
	return s
}

func destination(a netip.AddrPort, weight int) *libipvs.Destination {
	return &libipvs.Destination{Address: a.Addr().AsSlice(), Port: a.Port(), Weight: weight, AddressFamily: unix.AF_INET,
		ConnectionFlags: libipvs.ConnFwdMasq}
}

// syncServer is syncService and syncEndpoint for one virtual server.
func (b *Backend) syncServer(vs *VirtualServer) (int, error) {
	ops := 0
	want := &appliedVS{sp: vs.ServicePort, known: true, scheduler: vs.Scheduler, flags: vs.Flags, timeout: vs.Timeout}
	cur := b.applied[vs.Key]
	switch {
	case cur == nil:
		err := b.h.NewService(b.service(vs.Key, want))
		if IsExist(err) {
			err = b.h.UpdateService(b.service(vs.Key, want))
		}
		if err != nil {
			return ops, fmt.Errorf("could not add virtual server %s: %w", vs.Key, err)
		}
		ops++
		cur = &appliedVS{dests: map[netip.AddrPort]int{}}
		b.applied[vs.Key] = cur
	case cur.scheduler != want.scheduler || cur.flags != want.flags || cur.timeout != want.timeout:
		if err := b.h.UpdateService(b.service(vs.Key, want)); err != nil {
			return ops, fmt.Errorf("could not update virtual server %s: %w", vs.Key, err)
		}
		ops++
	}
	cur.sp, cur.known, cur.scheduler, cur.flags, cur.timeout = want.sp, true, want.scheduler, want.flags, want.timeout
	if vs.Bind && !b.bound[vs.Addr] {
		if err := b.sys.AddAddress(DummyDevice, vs.Addr); err != nil {
			return ops, err
		}
		b.bound[vs.Addr] = true
		ops++
	}
	n, err := b.syncDests(vs, cur)
	return ops + n, err
}

// syncDests adds the planned real servers, brings back those leaving
// gracefully (deleted and added afresh, as MoveRSOutofGracefulDeleteList
// does), corrects weights, and starts the graceful removal of the rest.
func (b *Backend) syncDests(vs *VirtualServer, cur *appliedVS) (int, error) {
	ops := 0
	svc := b.service(vs.Key, cur)
	want := make(map[netip.AddrPort]bool, len(vs.Dests))
	for _, d := range vs.Dests {
		want[d.Addr] = true
		w, have := cur.dests[d.Addr]
		tk := termKey{vs.Key, d.Addr}
		if have && b.terminating[tk] {
			if err := b.h.DelDestination(svc, destination(d.Addr, 0)); err != nil && !IsNotFound(err) {
				return ops, fmt.Errorf("could not remove leaving real server %s of %s: %w", d.Addr, vs.Key, err)
			}
			delete(b.terminating, tk)
			delete(cur.dests, d.Addr)
			have = false
			ops++
		}
		switch {
		case !have:
			err := b.h.NewDestination(svc, destination(d.Addr, d.Weight))
			if IsExist(err) {
				err = b.h.UpdateDestination(svc, destination(d.Addr, d.Weight))
			}
			if err != nil {
				return ops, fmt.Errorf("could not add real server %s to %s: %w", d.Addr, vs.Key, err)
			}
			ops++
		case w != d.Weight:
			// kube-proxy resets weights only on its first sync, since it
			// always programs 1; the faults program other weights.
			if err := b.h.UpdateDestination(svc, destination(d.Addr, d.Weight)); err != nil {
				return ops, fmt.Errorf("could not set the weight of %s in %s: %w", d.Addr, vs.Key, err)
			}
			ops++
		}
		cur.dests[d.Addr] = d.Weight
	}
	var leaving []netip.AddrPort
	for a := range cur.dests {
		if !want[a] && !b.terminating[termKey{vs.Key, a}] {
			leaving = append(leaving, a)
		}
	}
	if len(leaving) == 0 {
		return ops, nil
	}
	slices.SortFunc(leaving, netip.AddrPort.Compare)
	conns, err := b.connections(svc)
	if err != nil {
		return ops, err
	}
	for _, a := range leaving {
		n, err := b.gracefulDelete(vs.Key, svc, a, conns)
		ops += n
		if err != nil {
			return ops, err
		}
	}
	return ops, nil
}

// connections returns the active+inactive connection count of each real
// server of a virtual server (absent: not in the kernel).
func (b *Backend) connections(svc *libipvs.Service) (map[netip.AddrPort]int, error) {
	ds, err := b.h.GetDestinations(svc)
	if err != nil {
		return nil, fmt.Errorf("could not list the real servers of %s: %w", KeyOf(svc), err)
	}
	out := make(map[netip.AddrPort]int, len(ds))
	for _, d := range ds {
		out[destKey(d)] = d.ActiveConnections + d.InactiveConnections
	}
	return out, nil
}

// gracefulDelete is GracefulDeleteRS: delete at once when the protocol
// needs no draining (UDP, SCTP) or no connection remains; otherwise weight
// 0 and onto the terminating list.
func (b *Backend) gracefulDelete(k Key, svc *libipvs.Service, a netip.AddrPort, conns map[netip.AddrPort]int) (int, error) {
	cur := b.applied[k]
	n, present := conns[a]
	if !present {
		delete(cur.dests, a)
		return 0, nil
	}
	if k.Proto == "UDP" || k.Proto == "SCTP" || n == 0 {
		if err := b.h.DelDestination(svc, destination(a, 0)); err != nil && !IsNotFound(err) {
			return 0, fmt.Errorf("could not delete real server %s of %s: %w", a, k, err)
		}
		delete(cur.dests, a)
		return 1, nil
	}
	if err := b.h.UpdateDestination(svc, destination(a, 0)); err != nil {
		return 0, fmt.Errorf("could not set real server %s of %s to weight 0: %w", a, k, err)
	}
	cur.dests[a] = 0
	b.terminating[termKey{k, a}] = true
	return 1, nil
}

// drain deletes the real servers of the terminating list whose connections
// are gone (kube-proxy's tryDeleteRs).
func (b *Backend) drain() (int, error) {
	if len(b.terminating) == 0 {
		return 0, nil
	}
	byVS := map[Key][]netip.AddrPort{}
	for t := range b.terminating {
		byVS[t.vs] = append(byVS[t.vs], t.dest)
	}
	ops := 0
	var errs []error
	for k, dests := range byVS {
		cur := b.applied[k]
		if cur == nil {
			continue
		}
		svc := b.service(k, cur)
		conns, err := b.connections(svc)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, a := range dests {
			n, present := conns[a]
			switch {
			case !present:
				delete(b.terminating, termKey{k, a})
				delete(cur.dests, a)
			case n == 0:
				if err := b.h.DelDestination(svc, destination(a, 0)); err != nil && !IsNotFound(err) {
					errs = append(errs, fmt.Errorf("could not delete drained real server %s of %s: %w", a, k, err))
					continue
				}
				delete(b.terminating, termKey{k, a})
				delete(cur.dests, a)
				ops++
			}
		}
	}
	return ops, errors.Join(errs...)
}

// Drain runs the graceful-termination check now: real servers at weight 0
// whose connections are gone are deleted. It returns how many were.
func (b *Backend) Drain() (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, errClosed
	}
	return b.drain()
}

// Terminating lists the real servers leaving gracefully, as
// "TCP 10.96.0.10:80/10.244.0.5:8080", sorted.
func (b *Backend) Terminating() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]string, 0, len(b.terminating))
	for t := range b.terminating {
		out = append(out, t.vs.String()+"/"+t.dest.String())
	}
	slices.Sort(out)
	return out
}

func (b *Backend) startDrain() {
	if b.cfg.GracefulCheckPeriod <= 0 {
		close(b.done)
		return
	}
	go func() {
		defer close(b.done)
		t := time.NewTicker(b.cfg.GracefulCheckPeriod)
		defer t.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-t.C:
				_, _ = b.Drain()
			}
		}
	}()
}

// syncSets creates kube-proxy's ipsets (on a full sync) and brings their
// entries to the plan's with one `ipset restore -exist`.
func (b *Backend) syncSets(p *Plan, full bool) (int, string, error) {
	var lines []string
	if full {
		for _, s := range ipsets {
			lines = append(lines, createLine(s))
		}
		cur, err := b.readSets()
		if err != nil {
			return 0, "", err
		}
		b.sets = cur
	}
	ops := 0
	for _, name := range SetNames() {
		want := p.Sets[name]
		have := b.sets[name]
		if have == nil {
			have = map[string]bool{}
			b.sets[name] = have
		}
		wantSet := make(map[string]bool, len(want))
		for _, e := range want {
			wantSet[e] = true
			if !have[e] {
				lines = append(lines, "add "+name+" "+e)
				ops++
			}
		}
		var stale []string
		for e := range have {
			if !wantSet[e] {
				stale = append(stale, e)
			}
		}
		slices.Sort(stale)
		for _, e := range stale {
			lines = append(lines, "del "+name+" "+e)
			ops++
		}
	}
	if len(lines) == 0 {
		return 0, "", nil
	}
	text := strings.Join(lines, "\n") + "\n"
	if _, err := b.sys.Run(text, "ipset", "restore", "-exist"); err != nil {
		return ops, text, fmt.Errorf("could not restore the ipsets: %w", err)
	}
	for _, name := range SetNames() {
		m := make(map[string]bool, len(p.Sets[name]))
		for _, e := range p.Sets[name] {
			m[e] = true
		}
		b.sets[name] = m
	}
	return ops, text, nil
}

// readSets parses `ipset save` for the entries of kube-proxy's sets.
func (b *Backend) readSets() (map[string]map[string]bool, error) {
	out, err := b.sys.Run("", "ipset", "save")
	if err != nil {
		return nil, fmt.Errorf("could not list the ipsets: %w", err)
	}
	ours := map[string]bool{}
	for _, n := range SetNames() {
		ours[n] = true
	}
	sets := map[string]map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "add" && ours[f[1]] {
			if sets[f[1]] == nil {
				sets[f[1]] = map[string]bool{}
			}
			sets[f[1]][f[2]] = true
		}
	}
	return sets, nil
}

func (b *Backend) appliedKeys() []Key {
	keys := make([]Key, 0, len(b.applied))
	for k := range b.applied {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, Key.Compare)
	return keys
}

func sortedAddrs(m map[netip.Addr]bool) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// Cleanup removes everything the backend installed: every virtual server of
// the namespace (kube-proxy's cleanup flushes the table too), the dummy
// device, the KUBE- chains and their jumps, and the ipsets.
func (b *Backend) Cleanup() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed
	}
	var errs []error
	if err := b.h.Flush(); err != nil {
		errs = append(errs, fmt.Errorf("could not flush the ipvs table: %w", err))
	}
	if err := b.sys.DeleteLink(DummyDevice); err != nil {
		errs = append(errs, err)
	}
	if err := b.cleanupIPTables(); err != nil {
		errs = append(errs, err)
	}
	// ipset's -exist does not cover destroy: destroy only the sets present.
	if list, err := b.sys.Run("", "ipset", "list", "-n"); err != nil {
		errs = append(errs, fmt.Errorf("could not list the ipsets: %w", err))
	} else {
		var destroy strings.Builder
		for _, n := range strings.Fields(list) {
			if setInfo(n).name != "" {
				destroy.WriteString("destroy " + n + "\n")
			}
		}
		if destroy.Len() > 0 {
			if _, err := b.sys.Run(destroy.String(), "ipset", "restore"); err != nil {
				errs = append(errs, fmt.Errorf("could not destroy the ipsets: %w", err))
			}
		}
	}
	clear(b.applied)
	clear(b.terminating)
	clear(b.bound)
	clear(b.sets)
	b.jumps, b.jumpsTried, b.initialized, b.needFull = false, false, false, true
	return errors.Join(errs...)
}

// cleanupIPTables deletes the jumps into KUBE- chains and the chains.
func (b *Backend) cleanupIPTables() error {
	save, err := b.sys.Run("", b.Tool("save"))
	if err != nil {
		return err
	}
	if _, err := b.sys.Run(iptables.CleanupText(save), b.Tool("restore"), "--noflush"); err != nil {
		return fmt.Errorf("could not remove the iptables rules: %w", err)
	}
	return nil
}

// Close stops the graceful-termination checks and releases the sockets.
// The kernel state stays (the run deletes its namespaces).
func (b *Backend) Close() error {
	b.drainOnce.Do(func() { close(b.done) })
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	<-b.done
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.closer != nil {
		b.closer()
		b.closer = nil
	}
	return nil
}
