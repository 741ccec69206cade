// The front cache: freed pool blocks kept in C, in front of the Go pool,
// so that ONNX Runtime's Alloc of a size it freed recently, and its Free of
// a block the cache has room for, never cross into Go (a cgo callback costs
// about 65 ns each way, more than the rest of an Alloc+Free). See front.c
// and docs/ort.md.
#ifndef MEMGEN_ORT_FRONT_H
#define MEMGEN_ORT_FRONT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

// MEMGEN_ORT_FRONT_CLASSES bounds the number of size classes (the pool has
// 28); MEMGEN_ORT_FRONT_MAX_DEPTH bounds a bin's depth.
#define MEMGEN_ORT_FRONT_CLASSES 64
#define MEMGEN_ORT_FRONT_MAX_DEPTH 4096

// A slot of the address map: a pool block the bridge handed out, its class
// and whether it sits in a bin (cached) or ONNX Runtime holds it (live).
// addr 0 marks an empty slot.
typedef struct memgen_ort_front_slot {
	uintptr_t addr;
	int32_t cls;
	int32_t cached;
} memgen_ort_front_slot;

// A bin: a bounded LIFO stack of cached blocks of one class.
typedef struct memgen_ort_front_bin {
	uintptr_t *blocks; // depth entries
	int n;
} memgen_ort_front_bin;

// memgen_ort_front_stats are the front's figures, read under its lock.
// The live figures are ONNX Runtime's view of the whole allocator (every
// Alloc, Reserve and Free passes through the front's lock, hit or not), so
// that the peak is exact.
typedef struct memgen_ort_front_stats {
	int64_t live_blocks;   // blocks ONNX Runtime holds (pool blocks and reserved buffers)
	int64_t live_bytes;    // their bytes, as Go reported them (rounded / buffer size)
	int64_t peak_bytes;    // the most live_bytes has been since init or reset_peak
	int64_t max_request;   // the largest request served
	int64_t cached_blocks; // blocks in the bins
	int64_t cached_bytes;  // their bytes
	uint64_t hits;         // Allocs served from a bin, without Go
	uint64_t kept;         // Frees that put the block in a bin, without Go
	uint64_t untracked;    // blocks not tracked because the map could not grow
	int64_t enabled;       // 1 while the front caches
} memgen_ort_front_stats;

typedef struct memgen_ort_front {
	pthread_mutex_t mu;
	int enabled;
	int on;                 // the configuration allows caching (cap_bytes > 0)
	int nclass;
	int depth;              // per-bin bound
	int64_t cap_bytes;      // bound on cached_bytes
	uint64_t class_size[MEMGEN_ORT_FRONT_CLASSES];
	memgen_ort_front_bin bins[MEMGEN_ORT_FRONT_CLASSES];
	memgen_ort_front_slot *slots; // power-of-two long, at most half full
	size_t nslots, used;
	unsigned shift;
	memgen_ort_front_stats st;
	int fail_grow; // for the tests: the map's growth fails as if calloc had
} memgen_ort_front;

// memgen_ort_front_init sets f up with the pool's class sizes (ascending,
// n at most MEMGEN_ORT_FRONT_CLASSES), a byte cap (<= 0: the front never
// caches) and a per-bin depth (clamped to 1..MEMGEN_ORT_FRONT_MAX_DEPTH).
// It returns 0, or -1 when the arguments are bad or memory is short.
int memgen_ort_front_init(memgen_ort_front *f, const uint64_t *classes, int n, int64_t cap_bytes, int depth);

// memgen_ort_front_release frees f's bins and map (after Close: nothing is
// cached or tracked); f stays usable as an empty, disabled front.
void memgen_ort_front_release(memgen_ort_front *f);

// memgen_ort_front_class returns the index of the class a request of size
// bytes rounds to, -1 when none does (0, or above the largest class).
int memgen_ort_front_class(const memgen_ort_front *f, size_t size);

// memgen_ort_front_alloc pops a cached block for a request of size bytes
// (it is live again, counted as an allocation); NULL on a miss.
void *memgen_ort_front_alloc(memgen_ort_front *f, size_t size);

// memgen_ort_front_served records an allocation Go served: held bytes live
// (the block's rounded size, or the reserved buffer's), and, when pool is
// set and held is a class size, the block in the map so that its Free can
// be decided in C.
void memgen_ort_front_served(memgen_ort_front *f, void *p, size_t size, uint64_t held, int pool);

// What memgen_ort_front_free decided.
#define MEMGEN_ORT_FRONT_KEPT 0   // the block is in a bin: done
#define MEMGEN_ORT_FRONT_TO_GO 1  // Go frees it (then memgen_ort_front_freed)
#define MEMGEN_ORT_FRONT_DOUBLE 2 // the block is cached already: a double free, nothing changed

// memgen_ort_front_free decides ONNX Runtime's Free of p: a live tracked
// block goes into its bin when the bin's depth and the byte cap allow;
// otherwise it leaves the map and goes to Go, as does an address the map
// does not hold.
int memgen_ort_front_free(memgen_ort_front *f, void *p);

// memgen_ort_front_freed records that Go freed held bytes ONNX Runtime had
// held (0: the Free failed, nothing changed).
void memgen_ort_front_freed(memgen_ort_front *f, int64_t held);

// memgen_ort_front_drain takes up to cap cached blocks out of the bins and
// the map into out and returns how many; the caller frees them through Go.
// With disable set the front stops caching first (in the same critical
// section), so that nothing is cached after it returns.
size_t memgen_ort_front_drain(memgen_ort_front *f, uintptr_t *out, size_t cap, int disable);

// memgen_ort_front_enable lets the front cache again (if its cap allows)
// or, on 0, stops it caching (the caller drains it).
void memgen_ort_front_enable(memgen_ort_front *f, int on);

// memgen_ort_front_fail_grow makes every growth of f's map fail (on 1) as
// if memory were short, or work again (on 0): the tests' fault injection.
void memgen_ort_front_fail_grow(memgen_ort_front *f, int on);

// memgen_ort_front_read copies the figures; memgen_ort_front_reset_peak
// restarts the peak from the live bytes.
void memgen_ort_front_read(memgen_ort_front *f, memgen_ort_front_stats *out);
void memgen_ort_front_reset_peak(memgen_ort_front *f);

#endif
