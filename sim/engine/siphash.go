package engine

import "math/bits"

// hsiphash4 is the Linux kernel's hsiphash on 64-bit machines (lib/siphash.c:
// "on 64-bit, we make HalfSipHash1-3 actually be SipHash1-3"): SipHash with
// one compression and three finalisation rounds, truncated to 32 bits, of a
// 4-byte buffer holding v in little-endian order, which is what the kernel
// hashes when it calls hsiphash(&v, sizeof(v), key) with a host-order u32 on
// x86 (ip_vs_mh_hashkey). IPVS mh hashes with it. The tests check it, and
// the general hsiphash they keep beside it, against the kernel's own vectors
// (lib/tests/siphash_kunit.c, test_vectors_hsiphash, BITS_PER_LONG == 64).
func hsiphash4(key [2]uint64, v uint32) uint32 {
	v0, v1, v2, v3 := sipInit(key)
	return sipFinish(v0, v1, v2, v3, 4<<56|uint64(v))
}

func sipInit(key [2]uint64) (v0, v1, v2, v3 uint64) {
	v0 = 0x736f6d6570736575 ^ key[0]
	v1 = 0x646f72616e646f6d ^ key[1]
	v2 = 0x6c7967656e657261 ^ key[0]
	v3 = 0x7465646279746573 ^ key[1]
	return
}

func sipRound(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13)
	v1 ^= v0
	v0 = bits.RotateLeft64(v0, 32)
	v2 += v3
	v3 = bits.RotateLeft64(v3, 16)
	v3 ^= v2
	v0 += v3
	v3 = bits.RotateLeft64(v3, 21)
	v3 ^= v0
	v2 += v1
	v1 = bits.RotateLeft64(v1, 17)
	v1 ^= v2
	v2 = bits.RotateLeft64(v2, 32)
	return v0, v1, v2, v3
}

func sipFinish(v0, v1, v2, v3, b uint64) uint32 {
	v3 ^= b
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0 ^= b
	v2 ^= 0xff
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	return uint32((v0 ^ v1) ^ (v2 ^ v3))
}
