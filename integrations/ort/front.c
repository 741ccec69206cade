// The front cache (front.h): bins of freed pool blocks per size class and
// a map from address to class and state, under one mutex. The C side is an
// optimisation, never a second source of truth: every block it knows is
// also in the Go allocator's address map (as a held pool block) until Go
// frees it, so a block the front cannot track (the map could not grow) or
// does not keep (its bin is full) simply goes to Go, as without the front.
#include <stdlib.h>
#include <string.h>

#include "front.h"

static uint64_t mix(uintptr_t addr) { return (uint64_t)(addr >> 8) * 0x9E3779B97F4A7C15ull; }

static size_t home(const memgen_ort_front *f, uintptr_t addr) { return (size_t)(mix(addr) >> f->shift); }

// find returns the slot of addr, or -1.
static long find(const memgen_ort_front *f, uintptr_t addr) {
	if (f->nslots == 0) return -1;
	size_t mask = f->nslots - 1;
	for (size_t i = home(f, addr);; i = (i + 1) & mask) {
		if (f->slots[i].addr == addr) return (long)i;
		if (f->slots[i].addr == 0) return -1;
	}
}

static void put(memgen_ort_front *f, memgen_ort_front_slot s) {
	size_t mask = f->nslots - 1;
	size_t i = home(f, s.addr);
	while (f->slots[i].addr != 0) i = (i + 1) & mask;
	f->slots[i] = s;
}

// grow doubles the map; 0 on success, -1 when memory is short (the map is
// unchanged).
static int grow(memgen_ort_front *f) {
	size_t n = f->nslots ? 2 * f->nslots : 64;
	memgen_ort_front_slot *s = f->fail_grow ? NULL : calloc(n, sizeof *s);
	if (!s) return -1;
	memgen_ort_front_slot *old = f->slots;
	size_t oldn = f->nslots;
	f->slots = s;
	f->nslots = n;
	unsigned shift = 64;
	for (size_t k = n; k > 1; k >>= 1) shift--;
	f->shift = shift;
	for (size_t i = 0; i < oldn; i++)
		if (old[i].addr) put(f, old[i]);
	free(old);
	return 0;
}

// del removes slot i (backward-shift deletion: no tombstones).
static void del(memgen_ort_front *f, size_t i) {
	size_t mask = f->nslots - 1;
	for (size_t j = (i + 1) & mask; f->slots[j].addr != 0; j = (j + 1) & mask) {
		size_t k = home(f, f->slots[j].addr);
		// Move j into the hole at i unless its home lies in (i, j].
		if ((j > i && (k <= i || k > j)) || (j < i && k <= i && k > j)) {
			f->slots[i] = f->slots[j];
			i = j;
		}
	}
	f->slots[i].addr = 0;
	f->used--;
}

int memgen_ort_front_init(memgen_ort_front *f, const uint64_t *classes, int n, int64_t cap_bytes, int depth) {
	memset(f, 0, sizeof *f);
	if (n < 0 || n > MEMGEN_ORT_FRONT_CLASSES) return -1;
	for (int i = 0; i < n; i++)
		if (classes[i] == 0 || (i > 0 && classes[i] <= classes[i - 1])) return -1;
	if (depth < 1) depth = 1;
	if (depth > MEMGEN_ORT_FRONT_MAX_DEPTH) depth = MEMGEN_ORT_FRONT_MAX_DEPTH;
	if (pthread_mutex_init(&f->mu, NULL) != 0) return -1;
	f->nclass = n;
	f->depth = depth;
	f->cap_bytes = cap_bytes;
	memcpy(f->class_size, classes, (size_t)n * sizeof *classes);
	f->on = cap_bytes > 0 && n > 0;
	if (f->on) {
		for (int i = 0; i < n; i++) {
			f->bins[i].blocks = calloc((size_t)depth, sizeof(uintptr_t));
			if (!f->bins[i].blocks) {
				memgen_ort_front_release(f);
				return -1;
			}
		}
	}
	f->enabled = f->on;
	f->st.enabled = f->enabled;
	return 0;
}

void memgen_ort_front_release(memgen_ort_front *f) {
	pthread_mutex_lock(&f->mu);
	f->enabled = 0;
	f->on = 0;
	f->st.enabled = 0;
	for (int i = 0; i < f->nclass; i++) {
		free(f->bins[i].blocks);
		f->bins[i].blocks = NULL;
		f->bins[i].n = 0;
	}
	free(f->slots);
	f->slots = NULL;
	f->nslots = f->used = 0;
	f->st.cached_blocks = f->st.cached_bytes = 0;
	pthread_mutex_unlock(&f->mu);
}

int memgen_ort_front_class(const memgen_ort_front *f, size_t size) {
	if (size == 0 || f->nclass == 0 || size > f->class_size[f->nclass - 1]) return -1;
	int lo = 0, hi = f->nclass - 1; // the first class >= size
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		if (f->class_size[mid] >= size)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

static void live_add(memgen_ort_front *f, int64_t bytes, size_t size) {
	f->st.live_blocks++;
	f->st.live_bytes += bytes;
	if (f->st.live_bytes > f->st.peak_bytes) f->st.peak_bytes = f->st.live_bytes;
	if ((int64_t)size > f->st.max_request) f->st.max_request = (int64_t)size;
}

void *memgen_ort_front_alloc(memgen_ort_front *f, size_t size) {
	int c = memgen_ort_front_class(f, size);
	if (c < 0) return NULL;
	pthread_mutex_lock(&f->mu);
	memgen_ort_front_bin *b = &f->bins[c];
	if (!f->enabled || b->n == 0) {
		pthread_mutex_unlock(&f->mu);
		return NULL;
	}
	uintptr_t p = b->blocks[--b->n];
	long i = find(f, p); // every cached block is in the map
	if (i >= 0) f->slots[i].cached = 0;
	int64_t sz = (int64_t)f->class_size[c];
	f->st.cached_blocks--;
	f->st.cached_bytes -= sz;
	f->st.hits++;
	live_add(f, sz, size);
	pthread_mutex_unlock(&f->mu);
	return (void *)p;
}

void memgen_ort_front_served(memgen_ort_front *f, void *p, size_t size, uint64_t held, int pool) {
	pthread_mutex_lock(&f->mu);
	live_add(f, (int64_t)held, size);
	int c = pool && f->enabled ? memgen_ort_front_class(f, (size_t)held) : -1;
	if (c >= 0 && f->class_size[c] == held) {
		if (2 * (f->used + 1) > f->nslots && grow(f) != 0) {
			f->st.untracked++; // its Free goes to Go
		} else {
			put(f, (memgen_ort_front_slot){.addr = (uintptr_t)p, .cls = c, .cached = 0});
			f->used++;
		}
	}
	pthread_mutex_unlock(&f->mu);
}

int memgen_ort_front_free(memgen_ort_front *f, void *p) {
	pthread_mutex_lock(&f->mu);
	long i = find(f, (uintptr_t)p);
	if (i < 0) {
		pthread_mutex_unlock(&f->mu);
		return MEMGEN_ORT_FRONT_TO_GO;
	}
	memgen_ort_front_slot *s = &f->slots[i];
	if (s->cached) {
		pthread_mutex_unlock(&f->mu);
		return MEMGEN_ORT_FRONT_DOUBLE;
	}
	memgen_ort_front_bin *b = &f->bins[s->cls];
	int64_t sz = (int64_t)f->class_size[s->cls];
	if (!f->enabled || b->n >= f->depth || f->st.cached_bytes + sz > f->cap_bytes) {
		del(f, (size_t)i); // Go frees it; a later Alloc may track it again
		pthread_mutex_unlock(&f->mu);
		return MEMGEN_ORT_FRONT_TO_GO;
	}
	s->cached = 1;
	b->blocks[b->n++] = (uintptr_t)p;
	f->st.cached_blocks++;
	f->st.cached_bytes += sz;
	f->st.live_blocks--;
	f->st.live_bytes -= sz;
	f->st.kept++;
	pthread_mutex_unlock(&f->mu);
	return MEMGEN_ORT_FRONT_KEPT;
}

void memgen_ort_front_freed(memgen_ort_front *f, int64_t held) {
	if (held <= 0) return;
	pthread_mutex_lock(&f->mu);
	f->st.live_blocks--;
	f->st.live_bytes -= held;
	pthread_mutex_unlock(&f->mu);
}

size_t memgen_ort_front_drain(memgen_ort_front *f, uintptr_t *out, size_t cap, int disable) {
	size_t k = 0;
	pthread_mutex_lock(&f->mu);
	if (disable) {
		f->enabled = 0;
		f->st.enabled = 0;
	}
	for (int c = 0; c < f->nclass && k < cap; c++) {
		memgen_ort_front_bin *b = &f->bins[c];
		while (b->n > 0 && k < cap) {
			uintptr_t p = b->blocks[--b->n];
			long i = find(f, p);
			if (i >= 0) del(f, (size_t)i);
			f->st.cached_blocks--;
			f->st.cached_bytes -= (int64_t)f->class_size[c];
			out[k++] = p;
		}
	}
	pthread_mutex_unlock(&f->mu);
	return k;
}

void memgen_ort_front_enable(memgen_ort_front *f, int on) {
	pthread_mutex_lock(&f->mu);
	f->enabled = on && f->on;
	f->st.enabled = f->enabled;
	pthread_mutex_unlock(&f->mu);
}

void memgen_ort_front_read(memgen_ort_front *f, memgen_ort_front_stats *out) {
	pthread_mutex_lock(&f->mu);
	*out = f->st;
	pthread_mutex_unlock(&f->mu);
}

void memgen_ort_front_reset_peak(memgen_ort_front *f) {
	pthread_mutex_lock(&f->mu);
	f->st.peak_bytes = f->st.live_bytes;
	pthread_mutex_unlock(&f->mu);
}

void memgen_ort_front_fail_grow(memgen_ort_front *f, int on) {
	pthread_mutex_lock(&f->mu);
	f->fail_grow = on;
	pthread_mutex_unlock(&f->mu);
}
