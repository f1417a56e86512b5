package engine

import (
	"encoding/binary"
	"testing"
)

// hsiphash is the kernel's hsiphash of any length on 64-bit machines, the
// reference hsiphash4 is checked against (production hashes 4 bytes only).
func hsiphash(key [2]uint64, data []byte) uint32 {
	v0, v1, v2, v3 := sipInit(key)
	b := uint64(len(data)) << 56
	for len(data) >= 8 {
		m := binary.LittleEndian.Uint64(data)
		v3 ^= m
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
		v0 ^= m
		data = data[8:]
	}
	for i := len(data) - 1; i >= 0; i-- {
		b |= uint64(data[i]) << (8 * uint(i))
	}
	return sipFinish(v0, v1, v2, v3, b)
}

// TestHsiphashKernelVectors checks hsiphash against entries of the kernel's
// test_vectors_hsiphash (lib/tests/siphash_kunit.c, BITS_PER_LONG == 64):
// the hash of the bytes 0, 1, ..., n-1 under the key 00 01 ... 0f, and
// hsiphash4 against the 4-byte entry and against hsiphash.
func TestHsiphashKernelVectors(t *testing.T) {
	key := [2]uint64{0x0706050403020100, 0x0f0e0d0c0b0a0908}
	in := make([]byte, 64)
	for i := range in {
		in[i] = byte(i)
	}
	for n, want := range map[int]uint32{
		0: 0x050fc4dc, 1: 0x7d57ca93, 3: 0xe7ddf7fb, 4: 0x88d38328, 7: 0x9bb11140,
		8: 0x8d299a8e, 9: 0x6c063de4, 15: 0x2a519956, 16: 0x7d908b66, 63: 0xb7bbb3a8,
	} {
		if got := hsiphash(key, in[:n]); got != want {
			t.Errorf("hsiphash of %d bytes = %#08x, want the kernel's %#08x", n, got, want)
		}
	}
	if got := hsiphash4(key, 0x03020100); got != 0x88d38328 {
		t.Errorf("hsiphash4(0x03020100) = %#08x, want the kernel's 4-byte vector 0x88d38328", got)
	}
	for _, v := range []uint32{0, 1, 0x0a000001, 0xdeadbeef, 0xffffffff} {
		b := binary.LittleEndian.AppendUint32(nil, v)
		if hsiphash4(mhKey1, v) != hsiphash(mhKey1, b) {
			t.Errorf("hsiphash4(%#x) differs from hsiphash of its little-endian bytes", v)
		}
	}
}
