package engine

import "slices"

// Arena holds the memory of the nodes built in it (NewNodeIn): their
// engines, IPVS real servers and dest lists, and their per-service-port
// slices. A caller that builds node after node, each dropped before the
// next (the simulator's workers, one node run after another), calls Reset
// between them and the next node reuses the same blocks instead of
// allocating them anew: at 30,000 service ports a node run made some
// 12 MB of them, three fifths of the simulator's allocations, and the
// garbage collector's work with them. Not safe for concurrent use.
type Arena struct {
	ipt     blockList[IPTablesEngine]
	nft     blockList[NFTablesEngine]
	ipvs    blockList[IPVSEngine]
	dests   blockList[ipvsDest]
	ptrs    blockList[*ipvsDest]
	engines blockList[Engine]
	rules   blockList[Rules]
	// tables are the nodes' conntrack tables; tables[nextTable:] are
	// free since the last Reset.
	tables    []*Conntrack
	nextTable int
}

// conntrack returns an empty table for a node: the one the arena's
// node in this position had before the last Reset (emptied) when its
// configuration matches, else a new one. A caller that gives a node
// another table (the simulator takes a sized one when a shard's
// connections come) leaves this one to the arena and must not keep it.
func (a *Arena) conntrack(cfg ConntrackConfig) *Conntrack {
	i := a.nextTable
	a.nextTable++
	if i < len(a.tables) && a.tables[i].cfg == conntrackDefaults(cfg) {
		a.tables[i].Reset()
		return a.tables[i]
	}
	t := NewConntrack(cfg)
	if i < len(a.tables) {
		a.tables[i] = t
	} else {
		a.tables = append(a.tables, t)
	}
	return t
}

// NewArena returns an empty arena.
func NewArena() *Arena { return &Arena{} }

// Reset hands every block back to the arena: the nodes built in it since
// the last Reset must not be used any more.
func (a *Arena) Reset() {
	a.ipt.reset()
	a.nft.reset()
	a.ipvs.reset()
	a.dests.reset()
	a.ptrs.reset()
	a.engines.reset()
	a.rules.reset()
	a.nextTable = 0
}

// blockList hands out runs of elements from blocks it keeps; reset makes
// them all available again, from the first.
type blockList[T any] struct {
	blocks [][]T
	next   int // blocks[next:] are unused since the last reset
	free   []T // what is left of the block in use
}

// take returns n contiguous elements (capacity n) from the block in use,
// the next kept block with room, or a new block of max(n, size). They hold
// whatever an earlier user left: the caller overwrites or clears them.
func (b *blockList[T]) take(n, size int) []T {
	for len(b.free) < n {
		if b.next == len(b.blocks) {
			b.blocks = append(b.blocks, make([]T, max(n, size)))
		}
		b.free = b.blocks[b.next]
		b.next++
	}
	s := b.free[:n:n]
	b.free = b.free[n:]
	return s
}

func (b *blockList[T]) reset() { b.next, b.free = 0, nil }

// ipvsBlockSize is the size of the blocks of dests and dest pointers.
const ipvsBlockSize = 4096

// destSlice returns an empty slice with room for n dests. A nil arena
// allocates each slice on its own.
func (a *Arena) destSlice(n int) []ipvsDest {
	if a == nil || n > ipvsBlockSize/8 {
		return make([]ipvsDest, 0, n)
	}
	return a.dests.take(n, ipvsBlockSize)[:0]
}

// grow returns s with room for n more pointers (slices.Grow, the new
// backing array taken from the arena).
func (a *Arena) grow(s []*ipvsDest, n int) []*ipvsDest {
	if cap(s)-len(s) >= n {
		return s
	}
	want := len(s) + n
	if a == nil || want > ipvsBlockSize/8 {
		return slices.Grow(s, n)
	}
	out := a.ptrs.take(want, ipvsBlockSize)
	copy(out, s)
	return out[:len(s)]
}
