/* minimal.c: a complete memgen plugin serving host memory, DeviceAllocator only. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "memgen/mechanism.h"

/* One allocation, filed under the id the host assigned. */
struct alloc { struct alloc *next; memgen_handle id; unsigned char *base; uint64_t size; };
/* Slots run concurrently: every access holds mu. next_id numbers streams and fences. */
struct inst { pthread_mutex_t mu; struct alloc *allocs; uint64_t used, next_id; };

static _Thread_local char msg[128]; /* last_error: one message per thread */

static memgen_status fail(memgen_status st, const char *m) { return snprintf(msg, sizeof msg, "%s", m), st; }

static uint64_t last_error(void *instance, char *buf, uint64_t cap) {
  uint64_t n = strlen(msg) < cap ? strlen(msg) : cap - 1;
  (void)instance;
  memcpy(buf, msg, n);
  buf[n] = 0;
  return n;
}

static memgen_status open_instance(const char *config, memgen_open_out *out) {
  struct inst *in;
  if (config[0] != 0) return fail(MEMGEN_ERR_UNSUPPORTED, "minimal takes no configuration");
  if ((in = calloc(1, sizeof *in)) == NULL) return fail(MEMGEN_ERR_OUT_OF_MEMORY, "no memory for the instance");
  pthread_mutex_init(&in->mu, NULL);
  out->instance = in; /* the granularities stay the descriptor's */
  return MEMGEN_OK;
}

static void close_instance(void *instance) {
  struct inst *in = instance;
  for (struct alloc *a = in->allocs, *next; a != NULL; a = next) {
    next = a->next;
    munmap(a->base, a->size);
    free(a);
  }
  pthread_mutex_destroy(&in->mu);
  free(in);
}

static memgen_status allocate(void *instance, uint64_t deadline_ns, const memgen_alloc_request *req,
                              memgen_allocation_out *out) {
  struct inst *in = instance;
  uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), size = (req->size + pg - 1) / pg * pg;
  uint64_t align = req->align > pg ? req->align : pg, head;
  struct alloc *a = malloc(sizeof *a);
  unsigned char *p = mmap(NULL, size + align - pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  (void)deadline_ns; /* mmap is bounded */
  if (a == NULL || p == MAP_FAILED) {
    free(a);
    if (p != MAP_FAILED) munmap(p, size + align - pg);
    return fail(MEMGEN_ERR_OUT_OF_MEMORY, "mmap refused the memory");
  }
  head = (align - (uint64_t)(uintptr_t)p % align) % align; /* trim to the alignment */
  if (head > 0) munmap(p, head);
  if (align - pg - head > 0) munmap(p + head + size, align - pg - head);
  *a = (struct alloc){.id = out->id, .base = p + head, .size = size}; /* leave out->id as assigned */
  pthread_mutex_lock(&in->mu);
  a->next = in->allocs;
  in->allocs = a;
  in->used += size;
  pthread_mutex_unlock(&in->mu);
  out->addr = (memgen_device_addr)(uintptr_t)a->base;
  out->size = size;
  return MEMGEN_OK;
}

static memgen_status free_alloc(void *instance, memgen_handle id) {
  struct inst *in = instance;
  struct alloc **p, *a = NULL;
  pthread_mutex_lock(&in->mu);
  for (p = &in->allocs; *p != NULL; p = &(*p)->next) {
    if ((*p)->id == id) { a = *p, *p = a->next, in->used -= a->size; break; }
  }
  pthread_mutex_unlock(&in->mu);
  if (a == NULL) return fail(MEMGEN_ERR_RELEASED, "no allocation has this id");
  munmap(a->base, a->size); /* freed memory is no longer mapped */
  free(a);
  return MEMGEN_OK;
}

static memgen_bytes used_bytes(void *instance) {
  struct inst *in = instance;
  pthread_mutex_lock(&in->mu);
  memgen_bytes n = in->used;
  pthread_mutex_unlock(&in->mu);
  return n;
}

/* The device context: host memory, so a copy is a memmove inside live allocations. */
static unsigned char *span(struct inst *in, memgen_device_addr addr, uint64_t n) {
  for (struct alloc *a = in->allocs; a != NULL; a = a->next) {
    uint64_t base = (uint64_t)(uintptr_t)a->base;
    if (addr >= base && addr - base <= a->size && n <= a->size - (addr - base)) return a->base + (addr - base);
  }
  return NULL;
}

static memgen_status copy(struct inst *in, void *dst, memgen_device_addr ddst, const void *src, memgen_device_addr dsrc,
                          uint64_t n) {
  memgen_status st = MEMGEN_OK;
  pthread_mutex_lock(&in->mu);
  if ((dst == NULL && (dst = span(in, ddst, n)) == NULL) || (src == NULL && (src = span(in, dsrc, n)) == NULL)) {
    st = fail(MEMGEN_ERR_INVALID_RANGE, "the range is not inside one allocation");
  } else memmove(dst, src, n);
  pthread_mutex_unlock(&in->mu);
  return st;
}

static memgen_status new_id(void *instance, memgen_handle *out) {
  struct inst *in = instance;
  pthread_mutex_lock(&in->mu);
  *out = ++in->next_id;
  return pthread_mutex_unlock(&in->mu), MEMGEN_OK;
}
static memgen_status to_dev(void *i, memgen_handle s, memgen_device_addr d, const void *src, uint64_t n) {
  return (void)s, copy(i, NULL, d, src, 0, n);
}
static memgen_status from_dev(void *i, memgen_handle s, void *dst, uint64_t n, memgen_device_addr src) {
  return (void)s, copy(i, dst, 0, NULL, src, n);
}
static memgen_status on_dev(void *i, memgen_handle s, memgen_device_addr d, memgen_device_addr src, memgen_bytes n) {
  return (void)s, copy(i, NULL, d, NULL, src, n);
}
static memgen_status record(void *i, memgen_handle s, memgen_handle *f) { return (void)s, new_id(i, f); }
static memgen_status ok(void *i, memgen_handle s) { return (void)i, (void)s, MEMGEN_OK; } /* copies are synchronous */
static memgen_status done(void *i, memgen_handle f, int32_t *d) { return (void)i, (void)f, *d = 1, MEMGEN_OK; }
static void release(void *i, memgen_handle f) { (void)i, (void)f; }

static const memgen_device_allocator da = {sizeof da, MEMGEN_ABI_VERSION, allocate, free_alloc, used_bytes};
static const memgen_device_context dc = {sizeof dc, MEMGEN_ABI_VERSION, new_id, to_dev, from_dev, on_dev, record,
                                         ok, ok, done, release};
static memgen_plugin desc = {sizeof desc, MEMGEN_ABI_VERSION, "minimal", MEMGEN_DEVICE_KIND_HOST, 0, 0, 0,
                             open_instance, close_instance, last_error, &da, NULL, NULL, &dc, {NULL}};
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void fill(void) { desc.alloc_granularity = (uint64_t)sysconf(_SC_PAGESIZE); } /* known at run time */

MEMGEN_EXPORT const memgen_plugin *memgen_plugin_v2(uint32_t host_abi_version) {
  (void)host_abi_version;
  pthread_once(&once, fill);
  return &desc; /* granularity 0: no VirtualBacking or SharedMapping */
}
