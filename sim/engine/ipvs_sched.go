package engine

// The IPVS schedulers, each a port of the kernel's ip_vs_<name>.c over the
// engine's dest list (index 0 is the first dest after the list head). Every
// real server kube-proxy creates has weight 1, so the weighted variants
// matter only through weight 0 (a quiesced, gracefully deleted endpoint).
// No dest is ever overloaded (kube-proxy sets no thresholds).

// schedule picks a real server for a new connection, or nil when the
// scheduler finds none available.
func (e *IPVSEngine) schedule(c *Conn) *ipvsDest {
	switch e.sched {
	case RR:
		if e.cfg.Fault == FaultRotationStall {
			if d := e.stalled(e.rrCur); d != nil {
				return d
			}
		}
		return e.rr()
	case WRR:
		if e.cfg.Fault == FaultRotationStall {
			if d := e.stalled(e.wrrCl); d != nil {
				return d
			}
		}
		return e.wrr()
	case LC:
		return e.lc()
	case WLC:
		return e.wlc(connOverhead)
	case SED:
		return e.wlc(activePlusOne)
	case NQ:
		return e.nq()
	case SH:
		return available(e.shTab[SHBucket(c.SrcIP)])
	case DH:
		return available(e.dhTab[DHBucket(e.vip)])
	case MH:
		// kube-proxy sets FlagSourceHash (IP_VS_SVC_F_SCHED2, mh-port) for mh,
		// so the source port is hashed with the address; no fallback flag.
		return available(e.mhTab[MHBucket(c.SrcIP, c.SrcPort, len(e.mhTab))])
	}
	return nil
}

// stalled is FaultRotationStall (schedule calls it only then): every
// rotationStallEvery-th call, the dest at the rotation's mark (the last
// chosen) again, when it is still available; nil otherwise.
func (e *IPVSEngine) stalled(mark int) *ipvsDest {
	e.stall++
	if e.stall%rotationStallEvery != 0 || mark < 0 || mark >= len(e.dests) {
		return nil
	}
	return available(e.dests[mark])
}

func available(d *ipvsDest) *ipvsDest {
	if d == nil || d.weight <= 0 {
		return nil
	}
	return d
}

// rr is ip_vs_rr_schedule: scan circularly from the dest after the last one
// chosen (the list head at first) through that dest itself, and take the
// first with a positive weight.
func (e *IPVSEngine) rr() *ipvsDest {
	n := len(e.dests)
	for k := 0; k < n; k++ {
		i := (e.rrCur + 1 + k) % n
		if e.dests[i].weight > 0 {
			e.rrCur = i
			return e.dests[i]
		}
	}
	return nil
}

// wrrChanged is ip_vs_wrr_dest_changed (also its init): restart from the
// head, recompute the weight step (gcd) and the maximum weight.
func (e *IPVSEngine) wrrChanged() {
	e.wrrCl = -1
	var g, mx int32
	for _, d := range e.dests {
		if d.weight > 0 {
			if g > 0 {
				g = gcd32(d.weight, g)
			} else {
				g = d.weight
			}
		}
		if d.weight > mx {
			mx = d.weight
		}
	}
	if g == 0 {
		g = 1
	}
	e.wrrDi = g
	e.wrrMw = mx - (g - 1)
	if e.wrrCw > e.wrrMw || e.wrrCw == 0 {
		e.wrrCw = e.wrrMw
	} else if e.wrrDi > 1 {
		e.wrrCw = (e.wrrCw/e.wrrDi)*e.wrrDi + 1
	}
}

func gcd32(a, b int32) int32 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// wrr is ip_vs_wrr_schedule.
func (e *IPVSEngine) wrr() *ipvsDest {
	if e.wrrMw == 0 {
		return nil
	}
	n := len(e.dests)
	dest := e.wrrCl
	last := dest
	stop := -2
	lastPass, restarted := false, false
	for {
		for i := dest + 1; i < n; i++ {
			if e.dests[i].weight >= e.wrrCw {
				e.wrrCl = i
				return e.dests[i]
			}
			if i == stop {
				e.wrrCl = i
				return nil
			}
		}
		dest = -1
		e.wrrCw -= e.wrrDi
		if e.wrrCw <= 0 {
			e.wrrCw = e.wrrMw
			if lastPass || last == -1 {
				e.wrrCl = -1
				return nil
			}
			restarted = true
		}
		lastPass = e.wrrCw <= e.wrrDi
		if lastPass && restarted && last != -1 {
			stop = last
		}
	}
}

// connOverhead is ip_vs_dest_conn_overhead: activeconns*256 + inactconns.
func connOverhead(d *ipvsDest) int64 { return int64(d.active)<<8 + int64(d.inactive) }

// activePlusOne is the sed and nq overhead: activeconns + 1.
func activePlusOne(d *ipvsDest) int64 { return int64(d.active) + 1 }

// lc is ip_vs_lc_schedule: the first dest with the least overhead, among
// those with a non-zero weight.
func (e *IPVSEngine) lc() *ipvsDest {
	var least *ipvsDest
	var loh int64
	for _, d := range e.dests {
		if d.weight == 0 {
			continue
		}
		if doh := connOverhead(d); least == nil || doh < loh {
			least, loh = d, doh
		}
	}
	return least
}

// wlc is ip_vs_wlc_schedule, and with activePlusOne ip_vs_sed_schedule: the
// first dest with a positive weight, then any later one whose
// overhead/weight is strictly smaller (compared as loh*w > doh*lw).
func (e *IPVSEngine) wlc(overhead func(*ipvsDest) int64) *ipvsDest {
	start := -1
	for i, d := range e.dests {
		if d.weight > 0 {
			start = i
			break
		}
	}
	if start < 0 {
		return nil
	}
	least := e.dests[start]
	loh := overhead(least)
	for _, d := range e.dests[start+1:] {
		doh := overhead(d)
		if loh*int64(d.weight) > doh*int64(least.weight) {
			least, loh = d, doh
		}
	}
	return least
}

// nq is ip_vs_nq_schedule: an idle dest (no active connection) at once,
// else the shortest expected delay.
func (e *IPVSEngine) nq() *ipvsDest {
	var least *ipvsDest
	var loh int64
	for _, d := range e.dests {
		if d.weight == 0 {
			continue
		}
		doh := activePlusOne(d)
		if d.active == 0 {
			return d
		}
		if least == nil || loh*int64(d.weight) > doh*int64(least.weight) {
			least, loh = d, doh
		}
	}
	return least
}

// SHBucket is the sh bucket of a source address: ip_vs_sh_hashkey with
// port 0 (kube-proxy does not set sh-port) and offset 0, that is
// hash_32(ntohl(addr), 8) = (addr * GOLDEN_RATIO_32) >> 24 (hash_32 as in
// include/linux/hash.h since Linux 4.7).
func SHBucket(srcIP uint32) uint32 { return (srcIP * ipvsSHGoldenRatio32) >> (32 - 8) }

// DHBucket is ip_vs_dh_hashkey of a destination address:
// (ntohl(addr) * 2654435761) & 255. For a Service the destination is its
// ClusterIP, so dh sends every connection to one real server.
func DHBucket(dstIP uint32) uint32 { return (dstIP * ipvsDHHashMultiplier) & (ipvsSHTableSize - 1) }

// MHBucket is the mh lookup slot of a source: ip_vs_mh_hashkey with offset
// 0, hsiphash of ntohs(port) + ntohl(addr) under the fixed key hash1,
// modulo the table size.
func MHBucket(srcIP uint32, srcPort uint16, size int) uint32 {
	return hsiphash4(mhKey1, uint32(srcPort)+srcIP) % uint32(size)
}

var (
	mhKey1 = [2]uint64{ipvsMHHash1Key, ipvsMHHash1Key}
	mhKey2 = [2]uint64{ipvsMHHash2Key, ipvsMHHash2Key}
)

// reassign rebuilds the sh, dh and mh tables after the dest list changed.
// The kernel rebuilds after every single add, delete or weight change; a
// sync's changes are applied here together, which gives the same final
// table since nothing is scheduled in between.
func (e *IPVSEngine) reassign() {
	switch e.sched {
	case SH:
		e.shReassign()
	case DH:
		e.dhReassign()
	case MH:
		e.mhReassign()
	}
}

// shReassign is ip_vs_sh_reassign: walk the 256 buckets, giving each dest
// weight consecutive buckets (at least one), cycling through the list.
func (e *IPVSEngine) shReassign() {
	n := len(e.dests)
	p, count := 0, int32(0)
	for i := range e.shTab {
		if n == 0 {
			e.shTab[i] = nil
			continue
		}
		d := e.dests[p]
		e.shTab[i] = d
		if count++; count >= d.weight {
			p = (p + 1) % n
			count = 0
		}
	}
}

// dhReassign is ip_vs_dh_reassign: one bucket per dest in turn.
func (e *IPVSEngine) dhReassign() {
	n := len(e.dests)
	for i := range e.dhTab {
		if n == 0 {
			e.dhTab[i] = nil
			continue
		}
		e.dhTab[i] = e.dests[i%n]
	}
}

// mhReassign is ip_vs_mh_reassign: ip_vs_mh_permutate then
// ip_vs_mh_populate (Maglev, NSDI'16 §3.4) over last_weight, so a quiesced
// dest keeps its slots and simply is unavailable.
func (e *IPVSEngine) mhReassign() {
	m := len(e.mhTab)
	clear(e.mhTab)
	var g, mw int32
	for _, d := range e.dests {
		if d.lastWeight > 0 {
			if g > 0 {
				g = gcd32(d.lastWeight, g)
			} else {
				g = d.lastWeight
			}
		}
		if d.lastWeight > mw {
			mw = d.lastWeight
		}
	}
	if g < 1 {
		return
	}
	shift := fls32(uint32(mw/g)) - ipvsMHTableBits
	if shift < 0 {
		shift = 0
	}
	n := len(e.dests)
	offset := make([]uint32, n)
	skip := make([]uint32, n)
	perm := make([]uint32, n)
	turns := make([]int32, n)
	for i, d := range e.dests {
		v := uint32(d.port) + d.ip
		offset[i] = hsiphash4(mhKey1, v) % uint32(m)
		skip[i] = hsiphash4(mhKey2, v)%uint32(m-1) + 1
		perm[i] = offset[i]
		lw := d.lastWeight
		turns[i] = (lw / g) >> shift
		if turns[i] == 0 && lw != 0 {
			turns[i] = 1
		}
	}
	taken := make([]bool, m)
	filled, dt := 0, int32(0)
	for filled < m {
		for i := 0; i < n; {
			if turns[i] < 1 {
				i++
				continue
			}
			c := perm[i]
			for taken[c] {
				perm[i] += skip[i]
				if perm[i] >= uint32(m) {
					perm[i] -= uint32(m)
				}
				c = perm[i]
			}
			taken[c] = true
			e.mhTab[c] = e.dests[i]
			if filled++; filled == m {
				return
			}
			if dt++; dt >= turns[i] {
				dt = 0
				i++
			}
		}
	}
}

// fls32 is the kernel's fls: the 1-based index of the highest set bit, 0
// for 0.
func fls32(x uint32) int {
	n := 0
	for x != 0 {
		n++
		x >>= 1
	}
	return n
}

// MHTable returns the backend ID in each slot of the Maglev table (-1 for
// an empty slot); nil unless the scheduler is mh.
func (e *IPVSEngine) MHTable() []int32 {
	if e.mhTab == nil {
		return nil
	}
	out := make([]int32, len(e.mhTab))
	for i, d := range e.mhTab {
		out[i] = -1
		if d != nil {
			out[i] = d.id
		}
	}
	return out
}
