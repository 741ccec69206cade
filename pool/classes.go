package pool

import "math/bits"

// Alignment is the alignment of every block's address and size (what
// cudaMalloc promises, and a multiple of every scalar type's alignment).
const Alignment = 256

// SmallMax is the largest request served from the size-class slabs; larger
// ones are best-fit chunks of the arena.
const SmallMax = 1 << 20

// numClasses is the number of size classes: 256, 512, 768, 1024, then four
// per doubling up to SmallMax (1280, 1536, 1792, 2048, ..., 1 MiB).
const numClasses = 4 + 4*10

// classSize is the size of each class.
var classSize = func() (t [numClasses]uint64) {
	for i := range 4 {
		t[i] = uint64(i+1) * 256
	}
	for e := 10; e < 20; e++ {
		for k := 1; k <= 4; k++ {
			t[4+(e-10)*4+k-1] = 1<<e + uint64(k)<<(e-2)
		}
	}
	return t
}()

// classOf returns the class of a request of n bytes, 0 < n <= SmallMax.
func classOf(n uint64) int {
	if n <= 1024 {
		return int((n+255)/256) - 1
	}
	e := bits.Len64(n-1) - 1 // 2^e < n <= 2^(e+1)
	step := uint64(1) << (e - 2)
	k := (n - 1<<e + step - 1) / step
	return 4 + (e-10)*4 + int(k) - 1
}

// slabCount is how many blocks one slab of class c holds: enough for about
// SlabBytes, at least one; the slab is exactly count*size bytes (no tail).
func slabCount(c int, slabBytes uint64) int {
	return int(max(1, slabBytes/classSize[c]))
}

// roundLarge rounds a large request to the arena's alignment.
func roundLarge(n uint64) uint64 { return (n + Alignment - 1) &^ (Alignment - 1) }
