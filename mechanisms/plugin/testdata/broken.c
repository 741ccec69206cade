/*
 * broken.c: a DeviceAllocator plugin serving host memory from a fixed table,
 * correct as built plain, and broken one way by each of these macros (the
 * tests build every variant and check that the host or the suite catches it):
 *
 *   BROKEN_REUSED_ID   allocate files the new object under the id of a live
 *                      allocation and reports that id, not the one assigned
 *   BROKEN_USED_BYTES  used_bytes reports 4 KiB more than the plugin holds
 *   BROKEN_LEAKY_FREE  free reports success and drops the entry, but leaves
 *                      the memory mapped
 *   BROKEN_SLOW_MS=n   allocate sleeps n ms whatever its deadline
 *   BROKEN_LOCKLESS    the table has no lock; the window between finding a
 *                      free entry and claiming it (and between reading and
 *                      writing the used bytes) is widened with sched_yield,
 *                      as a preemption there would
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "memgen/mechanism.h"

#define SLOTS 4096

struct entry {
  memgen_handle id; /* 0: free */
  unsigned char *base;
  uint64_t size;
};

struct inst {
  pthread_mutex_t mu;
  struct entry table[SLOTS];
  uint64_t used, next_id;
};

#ifdef BROKEN_LOCKLESS
#define LOCK(in) ((void)(in))
#define UNLOCK(in) ((void)(in))
#define WINDOW() sched_yield()
#else
#define LOCK(in) pthread_mutex_lock(&(in)->mu)
#define UNLOCK(in) pthread_mutex_unlock(&(in)->mu)
#define WINDOW() ((void)0)
#endif

static uint64_t page(void) { return (uint64_t)sysconf(_SC_PAGESIZE); }

static memgen_status open_instance(const char *config, memgen_open_out *out) {
  struct inst *in;
  (void)config;
  if ((in = calloc(1, sizeof *in)) == NULL) {
    return MEMGEN_ERR_OUT_OF_MEMORY;
  }
  pthread_mutex_init(&in->mu, NULL);
  out->instance = in;
  return MEMGEN_OK;
}

static void close_instance(void *instance) {
  struct inst *in = instance;
  int i;
  for (i = 0; i < SLOTS; i++) {
    if (in->table[i].id != 0) {
      munmap(in->table[i].base, in->table[i].size);
    }
  }
  pthread_mutex_destroy(&in->mu);
  free(in);
}

static void add_used(struct inst *in, int64_t n) {
  uint64_t u = in->used;
  WINDOW();
  in->used = u + (uint64_t)n;
}

static memgen_status allocate(void *instance, uint64_t deadline_ns, const memgen_alloc_request *req,
                              memgen_allocation_out *out) {
  struct inst *in = instance;
  uint64_t size = (req->size + page() - 1) / page() * page();
  unsigned char *p;
  int i, at = -1;
  (void)deadline_ns;
#ifdef BROKEN_SLOW_MS
  {
    struct timespec ts = {BROKEN_SLOW_MS / 1000, (BROKEN_SLOW_MS % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
#endif
  p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return MEMGEN_ERR_OUT_OF_MEMORY;
  }
  LOCK(in);
#ifdef BROKEN_REUSED_ID
  for (i = 0; i < SLOTS; i++) {
    if (in->table[i].id != 0) {
      out->id = in->table[i].id; /* an id already live: the new object shadows the old one */
      break;
    }
  }
#endif
  for (i = 0; i < SLOTS && at < 0; i++) {
    if (in->table[i].id == 0) {
      at = i;
    }
  }
  if (at < 0) {
    UNLOCK(in);
    munmap(p, size);
    return MEMGEN_ERR_OUT_OF_MEMORY;
  }
  WINDOW();
  in->table[at].id = out->id;
  in->table[at].base = p;
  in->table[at].size = size;
  add_used(in, (int64_t)size);
  UNLOCK(in);
  out->addr = (memgen_device_addr)(uintptr_t)p;
  out->size = size;
  return MEMGEN_OK;
}

static memgen_status free_alloc(void *instance, memgen_handle id) {
  struct inst *in = instance;
  int i;
  LOCK(in);
  for (i = 0; i < SLOTS; i++) {
    if (in->table[i].id == id) {
      struct entry e = in->table[i];
      in->table[i].id = 0;
      add_used(in, -(int64_t)e.size);
      UNLOCK(in);
#ifndef BROKEN_LEAKY_FREE
      munmap(e.base, e.size);
#endif
      return MEMGEN_OK;
    }
  }
  UNLOCK(in);
  return MEMGEN_ERR_RELEASED;
}

static memgen_bytes used_bytes(void *instance) {
  struct inst *in = instance;
  memgen_bytes n;
  LOCK(in);
  n = in->used;
  UNLOCK(in);
#ifdef BROKEN_USED_BYTES
  n += 4096;
#endif
  return n;
}

/* The device context: copies inside live allocations. */
static unsigned char *span(struct inst *in, memgen_device_addr addr, uint64_t n) {
  int i;
  for (i = 0; i < SLOTS; i++) {
    struct entry *e = &in->table[i];
    uint64_t base = (uint64_t)(uintptr_t)e->base;
    if (e->id != 0 && addr >= base && addr - base <= e->size && n <= e->size - (addr - base)) {
      return e->base + (addr - base);
    }
  }
  return NULL;
}

static memgen_status copy(struct inst *in, void *dst, memgen_device_addr ddst, const void *src,
                          memgen_device_addr dsrc, uint64_t n) {
  memgen_status st = MEMGEN_OK;
  LOCK(in);
  if ((dst == NULL && (dst = span(in, ddst, n)) == NULL) || (src == NULL && (src = span(in, dsrc, n)) == NULL)) {
    st = MEMGEN_ERR_INVALID_RANGE;
  } else {
    memmove(dst, src, n);
  }
  UNLOCK(in);
  return st;
}

static memgen_status new_id(void *instance, memgen_handle *out) {
  struct inst *in = instance;
  pthread_mutex_lock(&in->mu);
  *out = ++in->next_id;
  pthread_mutex_unlock(&in->mu);
  return MEMGEN_OK;
}
static memgen_status to_dev(void *i, memgen_handle s, memgen_device_addr d, const void *src, uint64_t n) {
  (void)s;
  return copy(i, NULL, d, src, 0, n);
}
static memgen_status from_dev(void *i, memgen_handle s, void *dst, uint64_t n, memgen_device_addr src) {
  (void)s;
  return copy(i, dst, 0, NULL, src, n);
}
static memgen_status on_dev(void *i, memgen_handle s, memgen_device_addr d, memgen_device_addr src, memgen_bytes n) {
  (void)s;
  return copy(i, NULL, d, NULL, src, n);
}
static memgen_status record(void *i, memgen_handle s, memgen_handle *f) {
  (void)s;
  return new_id(i, f);
}
static memgen_status ok(void *i, memgen_handle s) {
  (void)i, (void)s;
  return MEMGEN_OK;
}
static memgen_status done(void *i, memgen_handle f, int32_t *d) {
  (void)i, (void)f;
  *d = 1;
  return MEMGEN_OK;
}
static void release(void *i, memgen_handle f) { (void)i, (void)f; }

static const memgen_device_allocator da = {sizeof da, MEMGEN_ABI_VERSION, allocate, free_alloc, used_bytes};
static const memgen_device_context dc = {sizeof dc, MEMGEN_ABI_VERSION, new_id, to_dev, from_dev, on_dev,
                                         record,    ok,                 ok,     done,   release};
static memgen_plugin desc = {sizeof desc, MEMGEN_ABI_VERSION, "broken", MEMGEN_DEVICE_KIND_HOST, 0, 0, 0,
                             open_instance, close_instance, NULL, &da, NULL, NULL, &dc, {NULL}};
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void fill(void) { desc.alloc_granularity = page(); }

MEMGEN_EXPORT const memgen_plugin *memgen_plugin_v2(uint32_t host_abi_version) {
  (void)host_abi_version;
  pthread_once(&once, fill);
  return &desc;
}
