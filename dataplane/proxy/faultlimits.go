package proxy

// The faults at the detection limit (skew-at-mde, affinity-leak,
// affinity-overstay): their parameters, the client hash two of them select
// clients with, and where each fault can be built.

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"

	"github.com/kpsim/kpsim/sim/cluster"
)

// SkewMDE is the relative raise of the first endpoint's share under
// FaultSkewAtMDE: the harness's default minimum detectable effect,
// scenario.DefaultMDE (10 %; a test pins the two together, since this
// package may not import the scenario format).
const SkewMDE = 0.10

// skewNum/skewDen is 1+SkewMDE as a fraction (11/10), for integer weights
// (TestSkewFraction holds them to SkewMDE).
const skewNum, skewDen = 11, 10

// MDESkewWeights are the integer weights of FaultSkewAtMDE for k endpoints
// in cascade order: 11(k-1) for the first and 10k-11 for each other, which
// sum to 10k(k-1), so that the first gets exactly (1+SkewMDE)/k. One endpoint
// gets weight 1 (the fault changes nothing); none, nil. nftables uses them as
// numgen buckets, IPVS as wrr weights.
func MDESkewWeights(k int) []uint64 {
	switch {
	case k <= 0:
		return nil
	case k == 1:
		return []uint64{1}
	}
	w := make([]uint64, k)
	w[0] = uint64(skewNum * (k - 1))
	for i := 1; i < k; i++ {
		w[i] = uint64(skewDen*k - skewNum)
	}
	return w
}

// MDESkewShares are the target shares of FaultSkewAtMDE for k endpoints:
// (1+SkewMDE)/k for the first and (1-(1+SkewMDE)/k)/(k-1) for each other.
func MDESkewShares(k int) []float64 {
	if k <= 0 {
		return nil
	}
	out := make([]float64, k)
	if k == 1 {
		out[0] = 1
		return out
	}
	out[0] = (1 + SkewMDE) / float64(k)
	for i := 1; i < k; i++ {
		out[i] = (1 - out[0]) / float64(k-1)
	}
	return out
}

// Client selection of the affinity faults: a client is affected when
// ClientBucket(address, buckets) is 0.
const (
	// LeakBuckets: FaultAffinityLeak affects one client address in ten.
	LeakBuckets = 10
	// OverstayBuckets: FaultAffinityOverstay affects one in two.
	OverstayBuckets = 2
	// ClientHashSeed is the seed of the client hash ("kpsi").
	ClientHashSeed uint32 = 0x6b707369
)

// ClientBucket is the bucket, out of n, of an IPv4 client address: Bob
// Jenkins' lookup3 hash (the kernel's jhash) of the address's four bytes in
// network order with ClientHashSeed, scaled into n by reciprocal_scale. It
// is what iptables' cluster match (xt_cluster, --cluster-hash-seed, on the
// connection's original source) and nftables' `jhash ip saddr mod n seed`
// compute on a little-endian machine, so the same clients are affected in
// both modes; TestClientBucketInKernel (dataplane/iptables) checks it
// against the kernel with both iptables backends and nft. A non-IPv4 address is bucket 0.
func ClientBucket(a netip.Addr, n uint32) uint32 { return JHashBucket(a, n, ClientHashSeed) }

// JHashBucket is ClientBucket with another seed: the bucket, out of n, that
// xt_cluster (--cluster-hash-seed seed) and nft's `jhash ip saddr mod n seed
// seed` give the IPv4 address a (0 for another address or n = 0).
func JHashBucket(a netip.Addr, n, seed uint32) uint32 {
	if !a.Is4() || n == 0 {
		return 0
	}
	b := a.As4()
	// The kernel loads the bytes as a native (little-endian) u32.
	key := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
	return uint32((uint64(jhash1Word(key, seed)) * uint64(n)) >> 32)
}

// jhash1Word is the kernel's jhash_1word (include/linux/jhash.h), equal to
// jhash() over four bytes.
func jhash1Word(k, seed uint32) uint32 {
	const initval = 0xdeadbeef
	a := k + seed + initval + 4
	b := seed + initval + 4
	c := b
	rol := bits.RotateLeft32
	c ^= b
	c -= rol(b, 14)
	a ^= c
	a -= rol(c, 11)
	b ^= a
	b -= rol(a, 25)
	c ^= b
	c -= rol(b, 16)
	a ^= c
	a -= rol(c, 4)
	b ^= a
	b -= rol(a, 14)
	c ^= b
	c -= rol(b, 24)
	return c
}

// LeakingClient reports whether FaultAffinityLeak affects the client.
func LeakingClient(a netip.Addr) bool { return ClientBucket(a, LeakBuckets) == 0 }

// OverstayingClient reports whether FaultAffinityOverstay affects the
// client.
func OverstayingClient(a netip.Addr) bool { return ClientBucket(a, OverstayBuckets) == 0 }

// notBuilt says, per fault and mode, why the fault cannot be built there
// (absent: it can).
var notBuilt = map[Fault]map[cluster.Mode]string{
	FaultAffinityLeak: {
		cluster.ModeIPVS: "ClientIP affinity is the kernel's persistence template, per virtual server: no per-client match can make some clients skip it",
	},
	FaultAffinityOverstay: {
		cluster.ModeIPVS: "the persistence timeout belongs to the virtual server, one for every client",
	},
	FaultConntrackFlushAll: {
		cluster.ModeIPVS: "IPVS forwards an established connection from its own connection table, which a conntrack flush does not touch: the connection keeps its real server",
	},
}

// Modes lists the modes (in cluster.Modes order) in which the fault can be
// built. Some faults also depend on the mode's settings: in
// IPVS, FaultSkewAtMDE needs a scheduler that honours weights (see
// dataplane/ipvs).
func (f Fault) Modes() []cluster.Mode {
	var out []cluster.Mode
	for _, m := range cluster.Modes() {
		if f.NotBuilt(m) == "" {
			out = append(out, m)
		}
	}
	return out
}

// NotBuilt is the one-line reason the fault cannot be built in mode, or ""
// when it can.
func (f Fault) NotBuilt(mode cluster.Mode) string { return notBuilt[f][mode] }

// ErrFaultNotBuilt is wrapped by the error a backend returns, at
// construction, for a fault it cannot build.
var ErrFaultNotBuilt = errors.New("cannot be built")

// NotBuiltError is the error for fault f in mode, with the reason: "<fault>
// cannot be built in <mode> mode: <reason>". It wraps ErrFaultNotBuilt.
func NotBuiltError(f Fault, mode cluster.Mode, reason string) error {
	return fmt.Errorf("%s %w in %s mode: %s", f, ErrFaultNotBuilt, mode, reason)
}

// CheckModes returns the error of the first fault of fs (in documentation
// order) that cannot be built in mode, or nil.
func (fs Faults) CheckModes(mode cluster.Mode) error {
	for _, f := range AllFaults() {
		if fs.Has(f) && !slices.Contains(f.Modes(), mode) {
			return NotBuiltError(f, mode, f.NotBuilt(mode))
		}
	}
	return nil
}
