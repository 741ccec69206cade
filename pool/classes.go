package pool

import "math/bits"

// Alignment is the alignment of every block's address and size (what
// cudaMalloc promises, and a multiple of every scalar type's alignment).
const Alignment = 256

// SmallMax is the largest request served from the size-class slabs; larger
// ones are best-fit chunks of the arena rounded to Alignment (as the
// caching allocator's pools are): slabs of classes above 64 KiB, where a
// class is asked for a few times, strand more bytes than best fit loses
// (measured: peak held / peak requested 1.5 with slabs up to 1 MiB).
const SmallMax = 64 << 10

// numClasses is the number of size classes: 256, 512, 768, 1024, then four
// per doubling up to SmallMax (1280, 1536, 1792, 2048, ..., 64 KiB).
const numClasses = 4 + 4*6

// classSize is the size of each class.
var classSize = func() (t [numClasses]uint64) {
	for i := range 4 {
		t[i] = uint64(i+1) * 256
	}
	for e := 10; e < 16; e++ {
		for k := 1; k <= 4; k++ {
			t[4+(e-10)*4+k-1] = 1<<e + uint64(k)<<(e-2)
		}
	}
	return t
}()

// Classes returns the size classes' sizes, ascending: a small request
// (up to SmallMax) is served a block of the first that holds it. A cache in
// front of the pool (integrations/ort's front cache, in C) bins blocks by
// this table instead of repeating the class formula.
func Classes() []uint64 {
	t := classSize
	return t[:]
}

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

// slabCount is how many blocks one slab of class c holds: about four
// blocks' worth (at least 64 KiB, at most slabBytes); the slab is exactly
// count*size bytes (no tail).
func slabCount(c int, slabBytes uint64) int {
	// Four blocks' worth, at least 64 KiB, at most slabBytes: a class
	// that is seldom asked for strands little in its one partial slab
	// (eight blocks: 1.28 on the random pattern, four 1.25, two 1.25-1.28
	// and 1.23 on ONNX Runtime's sequence).
	want := min(max(4*classSize[c], 64<<10), max(slabBytes, classSize[c]))
	return int(max(1, want/classSize[c]))
}
