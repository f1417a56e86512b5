package engine

// addrLists holds, for each endpoint position of a service port, a list of
// client addresses ordered from least to most recently touched, with one
// index from an address to all its entries. It is the state behind both the
// iptables `recent` lists (one per KUBE-SEP chain) and the nftables affinity
// sets (one per endpoint): both are keyed by source address and both keep
// the least recent entry at the head (xt_recent's lru_list; for nftables the
// head is the element that expires first, since every element has the same
// timeout and `update` refreshes it).
type addrLists struct {
	lists []addrList
	ents  []addrEntry
	free  int32 // head of the free-entry list, -1 if none
	live  int   // entries in use
	index addrIndex
}

type addrList struct {
	id         int32 // the endpoint (backend ID) the list belongs to
	head, tail int32 // least and most recent entry, -1 when empty
	n          int32
}

type addrEntry struct {
	ip         uint32
	list       int32 // position of its list
	last       int64 // last --set / update, virtual ns
	prev, next int32 // neighbours in its list
	inext      int32 // next entry with the same address (another list)
}

func newAddrLists() addrLists {
	return addrLists{free: -1, index: newAddrIndex()}
}

// reset lays out one empty list per backend, keeping the entries of lists
// whose endpoint stays (kube-proxy keeps a recent list or affinity set as
// long as its endpoint is programmed) and dropping the others (the kernel
// destroys a recent table with its last rule; kube-proxy deletes stale
// affinity sets).
func (a *addrLists) reset(backends []Backend) {
	old := a.lists
	pos := make(map[int32]int32, len(backends))
	a.lists = make([]addrList, len(backends))
	for i, b := range backends {
		a.lists[i] = addrList{id: b.ID, head: -1, tail: -1}
		pos[b.ID] = int32(i)
	}
	for _, l := range old {
		np, keep := pos[l.id]
		if !keep {
			for e := l.head; e != -1; {
				next := a.ents[e].next
				a.unindex(e)
				a.release(e)
				e = next
			}
			continue
		}
		a.lists[np] = l
		for e := l.head; e != -1; e = a.ents[e].next {
			a.ents[e].list = np
		}
	}
}

// first returns the first entry of an address (any list), or -1.
func (a *addrLists) first(ip uint32) int32 { return a.index.get(ip) }

// find returns the entry of ip in list pos, or -1.
func (a *addrLists) find(pos int32, ip uint32) int32 {
	for e := a.index.get(ip); e != -1; e = a.ents[e].inext {
		if a.ents[e].list == pos {
			return e
		}
	}
	return -1
}

// add appends a new entry for ip at the tail (most recent end) of list pos.
func (a *addrLists) add(pos int32, ip uint32, now int64) int32 {
	e := a.free
	if e != -1 {
		a.free = a.ents[e].next
	} else {
		e = int32(len(a.ents))
		a.ents = append(a.ents, addrEntry{})
	}
	l := &a.lists[pos]
	a.ents[e] = addrEntry{ip: ip, list: pos, last: now, prev: l.tail, next: -1, inext: a.index.get(ip)}
	if l.tail != -1 {
		a.ents[l.tail].next = e
	} else {
		l.head = e
	}
	l.tail = e
	l.n++
	a.live++
	a.index.set(ip, e)
	return e
}

// touch stamps an entry and moves it to the tail of its list.
func (a *addrLists) touch(e int32, now int64) {
	en := &a.ents[e]
	en.last = now
	l := &a.lists[en.list]
	if l.tail == e {
		return
	}
	// unlink
	if en.prev != -1 {
		a.ents[en.prev].next = en.next
	} else {
		l.head = en.next
	}
	a.ents[en.next].prev = en.prev // en is not the tail, so next exists
	// append
	en.prev, en.next = l.tail, -1
	a.ents[l.tail].next = e
	l.tail = e
}

// remove deletes an entry.
func (a *addrLists) remove(e int32) {
	en := &a.ents[e]
	l := &a.lists[en.list]
	if en.prev != -1 {
		a.ents[en.prev].next = en.next
	} else {
		l.head = en.next
	}
	if en.next != -1 {
		a.ents[en.next].prev = en.prev
	} else {
		l.tail = en.prev
	}
	l.n--
	a.unindex(e)
	a.release(e)
}

func (a *addrLists) unindex(e int32) {
	ip := a.ents[e].ip
	h := a.index.get(ip)
	if h == e {
		if nx := a.ents[e].inext; nx != -1 {
			a.index.set(ip, nx)
		} else {
			a.index.del(ip)
		}
		return
	}
	for p := h; p != -1; p = a.ents[p].inext {
		if a.ents[p].inext == e {
			a.ents[p].inext = a.ents[e].inext
			return
		}
	}
}

func (a *addrLists) release(e int32) {
	a.ents[e] = addrEntry{next: a.free, prev: -1, inext: -1, list: -1}
	a.free = e
	a.live--
}

// addrIndex maps an IPv4 address to an int32 with open addressing and
// linear probing (backward-shift deletion, no tombstones).
type addrIndex struct {
	keys  []uint64 // 0: empty; else 1<<32 | ip
	vals  []int32
	n     int
	shift uint
}

func newAddrIndex() addrIndex {
	const c = 16
	return addrIndex{keys: make([]uint64, c), vals: make([]int32, c), shift: 64 - 4}
}

func (x *addrIndex) slot(k uint64) uint64 { return (k * 0x9E3779B97F4A7C15) >> x.shift }

func (x *addrIndex) get(ip uint32) int32 {
	k := 1<<32 | uint64(ip)
	mask := uint64(len(x.keys) - 1)
	for i := x.slot(k); ; i = (i + 1) & mask {
		switch x.keys[i] {
		case k:
			return x.vals[i]
		case 0:
			return -1
		}
	}
}

func (x *addrIndex) set(ip uint32, v int32) {
	if (x.n+1)*4 > len(x.keys)*3 {
		x.grow()
	}
	k := 1<<32 | uint64(ip)
	mask := uint64(len(x.keys) - 1)
	for i := x.slot(k); ; i = (i + 1) & mask {
		switch x.keys[i] {
		case k:
			x.vals[i] = v
			return
		case 0:
			x.keys[i], x.vals[i] = k, v
			x.n++
			return
		}
	}
}

func (x *addrIndex) del(ip uint32) {
	k := 1<<32 | uint64(ip)
	mask := uint64(len(x.keys) - 1)
	i := x.slot(k)
	for ; x.keys[i] != k; i = (i + 1) & mask {
		if x.keys[i] == 0 {
			return
		}
	}
	// Backward-shift: move a later member of the cluster into the hole when
	// its home slot is no further along than the hole.
	for j := (i + 1) & mask; x.keys[j] != 0; j = (j + 1) & mask {
		h := x.slot(x.keys[j])
		if (j-h)&mask >= (j-i)&mask {
			x.keys[i], x.vals[i] = x.keys[j], x.vals[j]
			i = j
		}
	}
	x.keys[i] = 0
	x.n--
}

func (x *addrIndex) grow() {
	keys, vals := x.keys, x.vals
	x.keys = make([]uint64, 2*len(keys))
	x.vals = make([]int32, 2*len(keys))
	x.shift--
	x.n = 0
	mask := uint64(len(x.keys) - 1)
	for i, k := range keys {
		if k == 0 {
			continue
		}
		j := x.slot(k)
		for x.keys[j] != 0 {
			j = (j + 1) & mask
		}
		x.keys[j], x.vals[j] = k, vals[i]
		x.n++
	}
}
