package ipvs

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	libipvs "github.com/moby/ipvs"

	"github.com/kpsim/kpsim/dataplane"
	"github.com/kpsim/kpsim/sim/cluster"
)

// Counters maps the kernel's IPVS statistics to service ports and
// endpoints: each real server's incoming packets and bytes (a probe is one
// SYN, so its packets are its new connections, like the DNAT rule counter
// of the iptables mode), summed over the virtual servers of a service port
// (its cluster IP and node ports).
//
// The kernel publishes per-service and per-real-server statistics only when
// its estimator runs, every 2 seconds (net/netfilter/ipvs/ip_vs_est.c; the
// netlink dump copies the estimator's snapshot), while
// /proc/net/ip_vs_stats_percpu shows the live totals. Counters polls until
// the published totals of the services equal the live ones, so the numbers
// include every packet seen before the call, or until Config.StatsWait has
// passed (a deleted service leaves the totals unequal for ever; the wait
// then still covers one estimator run).
func (b *Backend) Counters() ([]dataplane.Counter, error) {
	deadline := b.clock.now().Add(b.cfg.StatsWait)
	for {
		svcs, dests, keys, err := b.readStats()
		if err != nil {
			return nil, err
		}
		if b.published(svcs) || b.clock.now().After(deadline) {
			return b.mapCounters(svcs, dests, keys), nil
		}
		b.clock.sleep(statsPoll)
	}
}

// statsPoll is how often Counters reads the statistics while it waits for
// the estimator (a twentieth of its 2-second period).
const statsPoll = 100 * time.Millisecond

// clock is the time Counters waits in. Its zero value is the real clock;
// unit tests set both functions to a fake clock, so that the wait for the
// estimator is checked without sleeping.
type clock struct {
	Now   func() time.Time
	Sleep func(time.Duration)
}

func (c clock) now() time.Time {
	if c.Now == nil {
		return time.Now()
	}
	return c.Now()
}

func (c clock) sleep(d time.Duration) {
	if c.Sleep == nil {
		time.Sleep(d)
		return
	}
	c.Sleep(d)
}

func (b *Backend) readStats() ([]*libipvs.Service, map[Key][]*libipvs.Destination, map[Key]cluster.ServicePortName, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, nil, nil, errClosed
	}
	if b.LastPlan == nil {
		return nil, nil, nil, fmt.Errorf("no rules applied yet")
	}
	svcs, err := b.h.GetServices()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("could not read the ipvs statistics: %w", err)
	}
	dests := make(map[Key][]*libipvs.Destination, len(svcs))
	keys := map[Key]cluster.ServicePortName{}
	for _, s := range svcs {
		k := KeyOf(s)
		a := b.applied[k]
		if a == nil || !a.known {
			continue
		}
		ds, err := b.h.GetDestinations(s)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("could not read the statistics of %s: %w", k, err)
		}
		dests[k] = ds
		keys[k] = a.sp
	}
	return svcs, dests, keys, nil
}

// published reports whether the services' published connection and packet
// totals equal the kernel's live ones (compared in 32 bits, the width of
// the netlink statistics libipvs reads).
func (b *Backend) published(svcs []*libipvs.Service) bool {
	text, err := b.sys.StatsPerCPU()
	if err != nil {
		return true // nothing to compare with: take what is published
	}
	conns, pkts, ok := ParseStatsPerCPU(text)
	if !ok {
		return true
	}
	var sc, sp uint32
	for _, s := range svcs {
		sc += s.Stats.Connections
		sp += s.Stats.PacketsIn
	}
	return uint32(conns) == sc && uint32(pkts) == sp
}

// ParseStatsPerCPU sums the per-CPU rows of /proc/net/ip_vs_stats_percpu:
// total connections and incoming packets (hexadecimal columns). The "~" row
// (the estimator's snapshot) and the rate rows are skipped.
func ParseStatsPerCPU(text string) (conns, inPkts uint64, ok bool) {
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		if _, err := strconv.ParseUint(f[0], 16, 32); err != nil {
			continue
		}
		c, err1 := strconv.ParseUint(f[1], 16, 64)
		p, err2 := strconv.ParseUint(f[2], 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		conns += c
		inPkts += p
		ok = true
	}
	return conns, inPkts, ok
}

func (b *Backend) mapCounters(svcs []*libipvs.Service, dests map[Key][]*libipvs.Destination, keys map[Key]cluster.ServicePortName) []dataplane.Counter {
	type ck struct {
		spn cluster.ServicePortName
		ep  string
	}
	sum := map[ck]*dataplane.Counter{}
	for _, s := range svcs {
		k := KeyOf(s)
		spn, ok := keys[k]
		if !ok {
			continue
		}
		for _, d := range dests[k] {
			key := ck{spn, destKey(d).String()}
			c := sum[key]
			if c == nil {
				c = &dataplane.Counter{ServicePort: spn, Endpoint: key.ep}
				sum[key] = c
			}
			c.Packets += uint64(d.Stats.PacketsIn)
			c.Bytes += d.Stats.BytesIn
		}
	}
	out := make([]dataplane.Counter, 0, len(sum))
	for _, c := range sum {
		out = append(out, *c)
	}
	dataplane.SortCounters(out)
	return out
}
