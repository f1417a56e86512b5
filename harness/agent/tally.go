package agent

import (
	"cmp"
	"net/netip"
	"slices"
	"sync"
)

// tally is an agent's memory of what it observed, by tag. It keeps the
// detail (arrivals by endpoint and client, ICMP errors) of at most max
// tags: past that the tag first seen longest ago is dropped and marked
// evicted until a forget clears it. The per-tag totals behind Foreign are
// kept for all 256 tags, always. Safe for concurrent use.
type tally struct {
	mu      sync.Mutex
	max     int
	tags    map[uint8]*tagCounts
	order   []uint8 // tags with detail, oldest first
	evicted [MaxTag + 1]bool
	seen    [MaxTag + 1]int // packets per tag since the start
	total   int
}

type tagCounts struct {
	arrivals  map[arrivalKey]int
	rejects   int
	otherICMP int
}

type arrivalKey struct {
	endpoint netip.AddrPort
	client   netip.Addr
}

func newTally(max int) *tally { return &tally{max: max, tags: map[uint8]*tagCounts{}} }

// get returns tag's counts, making them (and dropping the oldest tag past
// max) on first use. t.mu is held.
func (t *tally) get(tag uint8) *tagCounts {
	c := t.tags[tag]
	if c != nil {
		return c
	}
	if len(t.order) >= t.max {
		old := t.order[0]
		t.order = t.order[1:]
		delete(t.tags, old)
		t.evicted[old] = true
	}
	c = &tagCounts{arrivals: map[arrivalKey]int{}}
	t.tags[tag] = c
	t.order = append(t.order, tag)
	return c
}

// arrival counts a probe of tag that reached endpoint from client.
func (t *tally) arrival(tag uint8, endpoint netip.AddrPort, client netip.Addr) {
	t.mu.Lock()
	t.get(tag).arrivals[arrivalKey{endpoint, client}]++
	t.seen[tag]++
	t.total++
	t.mu.Unlock()
}

// icmp counts a destination-unreachable of code quoting a probe of tag.
func (t *tally) icmp(tag uint8, portUnreachable bool) {
	t.mu.Lock()
	c := t.get(tag)
	if portUnreachable {
		c.rejects++
	} else {
		c.otherICMP++
	}
	t.seen[tag]++
	t.total++
	t.mu.Unlock()
}

// counts is tag's Counts (ObserverDrops is the caller's).
func (t *tally) counts(tag uint8) Counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := Counts{Tag: uint32(tag), Arrivals: []Arrival{}, Foreign: t.total - t.seen[tag], Evicted: t.evicted[tag]}
	c := t.tags[tag]
	if c == nil {
		return out
	}
	out.Rejects, out.OtherICMP = c.rejects, c.otherICMP
	keys := make([]arrivalKey, 0, len(c.arrivals))
	for k := range c.arrivals {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b arrivalKey) int {
		return cmp.Or(a.endpoint.Compare(b.endpoint), a.client.Compare(b.client))
	})
	for _, k := range keys {
		out.Arrivals = append(out.Arrivals, Arrival{Endpoint: k.endpoint.String(), Client: k.client.String(), N: c.arrivals[k]})
	}
	return out
}

// forget drops the counts of every tag below below (and their evicted
// marks): a later packet of such a tag starts it afresh.
func (t *tally) forget(below int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.order = slices.DeleteFunc(t.order, func(tag uint8) bool { return int(tag) < below })
	for tag := range t.tags {
		if int(tag) < below {
			delete(t.tags, tag)
		}
	}
	for tag := 0; tag < min(below, len(t.evicted)); tag++ {
		t.evicted[tag] = false
	}
}
