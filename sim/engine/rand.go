package engine

import "math/rand/v2"

// Rand is the engines' random source: a caller-owned math/rand/v2 PCG used
// directly (no interface call on the hot path). One Rand belongs to one node;
// the caller seeds it and reports the seed.
type Rand struct {
	src *rand.PCG
}

// NewRand wraps a PCG. The engines draw from it and from nothing else.
func NewRand(src *rand.PCG) *Rand { return &Rand{src: src} }

// NewRandSeed is NewRand(rand.NewPCG(seed1, seed2)).
func NewRandSeed(seed1, seed2 uint64) *Rand { return NewRand(rand.NewPCG(seed1, seed2)) }

// Uint64 draws 64 random bits.
func (r *Rand) Uint64() uint64 { return r.src.Uint64() }

// Uint32 draws 32 random bits, like the kernel's get_random_u32().
func (r *Rand) Uint32() uint32 { return uint32(r.src.Uint64() >> 32) }

// Shuffle permutes n elements with Fisher-Yates.
func (r *Rand) Shuffle(n int, swap func(i, j int)) {
	for i := n - 1; i > 0; i-- {
		j := int((uint64(r.Uint32()) * uint64(i+1)) >> 32)
		swap(i, j)
	}
}
