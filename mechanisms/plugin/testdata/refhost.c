/*
 * refhost: the reference memgen plugin, in C11. It serves host memory with
 * the kernel's primitives, as mechanisms/cpu does in Go:
 *
 *   DeviceAllocator  anonymous mmap, populated (MADV_POPULATE_WRITE)
 *   VirtualBacking   PROT_NONE reservations; commit = mprotect read-write +
 *                    populate, decommit = MADV_DONTNEED + PROT_NONE
 *   SharedMapping    memfd backings mapped MAP_SHARED|MAP_FIXED into
 *                    reservations; an unmapped view becomes PROT_NONE
 *                    reserved space again, never a hole
 *   device context   synchronous streams: a copy checks that every byte it
 *                    reads is backed and every byte it writes is writable,
 *                    then memmoves
 *
 * Every object is filed under the id the host assigned it (out->id on
 * creation) and looked up under the instance's mutex, so an id the host
 * should never pass (released, foreign) is refused with MEMGEN_ERR_RELEASED
 * instead of being dereferenced. Streams and fences are numbered from a
 * per-instance counter. open takes "granularity=N" (a power of two, a
 * multiple of the page) for reservations and backings; last_error keeps one
 * message per thread.
 *
 * docs/cabi.md walks through this file. The tests build it with cc, also with
 * macros that emulate other builds of the ABI (REFHOST_NEWER_MINOR,
 * REFHOST_MAJOR, REFHOST_SLOTS_MAJOR) and broken plugins (REFHOST_BAD_*,
 * REFHOST_NO_ENTRY, REFHOST_NULL_DESCRIPTOR, REFHOST_NAME), among them the
 * variants memgen plugin-check must report without dying itself:
 *
 *   REFHOST_BAD_COMMIT       commit reports success and installs nothing
 *   REFHOST_BAD_DECOMMIT     decommit reports success and keeps everything
 *   REFHOST_HANG_COMMIT      commit never returns
 *   REFHOST_UNMAPPED_COMMIT  commit marks and counts the granules committed
 *                            without mapping them: a copy into them faults
 *   REFHOST_OVERRUN_OUT      allocate writes 64 bytes past *out
 *   REFHOST_OVERRUN_DST      stream_copy_from_device writes 64 bytes past dst
 *   REFHOST_OVERLAP          allocate reports the address of another live
 *                            allocation
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "memgen/mechanism.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#ifndef REFHOST_MAJOR
#define REFHOST_MAJOR MEMGEN_ABI_MAJOR
#endif
#ifndef REFHOST_MINOR
#define REFHOST_MINOR MEMGEN_ABI_MINOR
#endif
#ifdef REFHOST_NEWER_MINOR
#undef REFHOST_MINOR
#define REFHOST_MINOR (MEMGEN_ABI_MINOR + 1)
#endif
#define REFHOST_VERSION MEMGEN_ABI_VERSION_OF(REFHOST_MAJOR, REFHOST_MINOR)
/* The version of the structs of slots; REFHOST_SLOTS_MAJOR sets theirs alone. */
#ifdef REFHOST_SLOTS_MAJOR
#define REFHOST_SLOTS_VERSION MEMGEN_ABI_VERSION_OF(REFHOST_SLOTS_MAJOR, REFHOST_MINOR)
#else
#define REFHOST_SLOTS_VERSION REFHOST_VERSION
#endif

/* The largest request considered: the 47-bit user address space. */
#define MAX_SIZE ((uint64_t)1 << 47)

enum kind { K_ALLOC = 1, K_RES, K_BACKING, K_VIEW, K_STREAM, K_FENCE };

/* A granule of a reservation: no backing, committed, or mapped by a view. */
#define G_NONE NULL
#define G_COMMITTED ((struct obj *)1)

/* One object of an instance; what it is says kind. */
struct obj {
  struct obj *next;
  uint64_t id;
  enum kind kind;
  unsigned char *base; /* ALLOC, RES: the mapping */
  uint64_t size;       /* ALLOC, RES, BACKING, VIEW: bytes */
  uint64_t gsz;        /* RES: the granularity it was reserved with */
  /* RES */
  struct obj **gran; /* per granule: G_NONE, G_COMMITTED or the view */
  uint64_t committed, views;
  /* BACKING */
  int fd;
  uint64_t mapped; /* views of the backing */
  /* VIEW */
  struct obj *res, *backing;
  uint64_t off;
  memgen_access access;
};

/* At most this many freed objects are kept for reuse per instance. */
#define MAX_SPARE 64

struct instance {
  pthread_mutex_t mu;
  struct obj *objs;
  struct obj *spare; /* freed objects kept for reuse, nspare of them */
  unsigned nspare;
  uint64_t next_id; /* streams and fences */
  uint64_t used;
  uint64_t gran; /* reservations and backings */
};

/* The message of the last slot that failed on this thread (last_error). */
static _Thread_local char last_msg[256];

static memgen_status fail(memgen_status st, const char *msg) {
  snprintf(last_msg, sizeof last_msg, "%s", msg);
  return st;
}

static uint64_t ref_last_error(void *instance, char *buf, uint64_t cap) {
  size_t n = strlen(last_msg);
  (void)instance;
  if (n >= cap) {
    n = cap - 1;
  }
  memcpy(buf, last_msg, n);
  buf[n] = 0;
  return n;
}

/* The page size, read once by the entry point (before any instance opens). */
static uint64_t page;

static uint64_t page_size(void) { return page; }

static struct obj *find(struct instance *in, uint64_t id, enum kind k) {
  struct obj *o;
  for (o = in->objs; o != NULL; o = o->next) {
    if (o->id == id && o->kind == k) {
      return o;
    }
  }
  return NULL;
}

/*
 * add files a new object under id (0: a stream or fence, numbered here). It
 * reuses a freed object when the instance keeps one: an allocate and a free
 * then cost no malloc. The caller holds the mutex.
 */
static struct obj *add(struct instance *in, enum kind k, uint64_t id) {
  struct obj *o = in->spare;
  if (o != NULL) {
    in->spare = o->next;
    in->nspare--;
    memset(o, 0, sizeof *o);
  } else if ((o = calloc(1, sizeof *o)) == NULL) {
    return NULL;
  }
  o->kind = k;
  o->id = id != 0 ? id : ++in->next_id;
  o->fd = -1;
  o->next = in->objs;
  in->objs = o;
  return o;
}

static void drop(struct instance *in, struct obj *o) {
  struct obj **p;
  for (p = &in->objs; *p != NULL; p = &(*p)->next) {
    if (*p == o) {
      *p = o->next;
      break;
    }
  }
  free(o->gran);
  o->gran = NULL;
  if (in->nspare < MAX_SPARE) {
    o->next = in->spare;
    in->spare = o;
    in->nspare++;
    return;
  }
  free(o);
}

static memgen_status errno_status(int e) {
  return (e == ENOMEM || e == EAGAIN || e == ENOSPC || e == EFAULT) ? MEMGEN_ERR_OUT_OF_MEMORY
                                                                    : MEMGEN_ERR_INVALID_RANGE;
}

/* round_up rounds n up to g (a power of two); 0 when it overflows or is too large. */
static uint64_t round_up(uint64_t n, uint64_t g) {
  uint64_t r = (n + g - 1) & ~(g - 1);
  return (r < n || r > MAX_SIZE) ? 0 : r;
}

/* populate faults in n bytes at p for writing, so an out-of-memory surfaces now. */
static int populate(void *p, uint64_t n) {
  uint64_t i;
  if (madvise(p, n, MADV_POPULATE_WRITE) == 0) {
    return 0;
  }
  if (errno != EINVAL) {
    return -1;
  }
  for (i = 0; i < n; i += page_size()) {
    ((volatile unsigned char *)p)[i] = 0;
  }
  return 0;
}

/* map_aligned maps n bytes (a multiple of the page) aligned to align. */
static void *map_aligned(uint64_t n, uint64_t align, int prot, int flags) {
  uint64_t pg = page_size(), total, head, tail;
  unsigned char *p, *q;
  if (align < pg) {
    align = pg;
  }
  total = n + align - pg;
  p = mmap(NULL, total, prot, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
  if (p == MAP_FAILED) {
    return NULL;
  }
  head = (align - (uint64_t)(uintptr_t)p % align) % align;
  q = p + head;
  tail = total - head - n;
  if (head > 0) {
    munmap(p, head);
  }
  if (tail > 0) {
    munmap(q + n, tail);
  }
  return q;
}

/* ---- instances ------------------------------------------------------- */

static memgen_status ref_open(const char *config, memgen_open_out *out) {
  struct instance *in;
  uint64_t g = out->granularity;
  if (config[0] != 0) {
    char *end;
    if (strncmp(config, "granularity=", 12) != 0) {
      return fail(MEMGEN_ERR_UNSUPPORTED, "refhost knows one configuration key: granularity");
    }
    g = strtoull(config + 12, &end, 0);
    if (*end != 0 || g == 0 || (g & (g - 1)) != 0 || g % page_size() != 0) {
      return fail(MEMGEN_ERR_UNSUPPORTED, "granularity must be a power of two and a multiple of the page size");
    }
  }
  in = calloc(1, sizeof *in);
  if (in == NULL) {
    return fail(MEMGEN_ERR_OUT_OF_MEMORY, "no memory for the instance");
  }
  pthread_mutex_init(&in->mu, NULL);
  in->gran = g;
  out->instance = in;
  out->granularity = g;
  return MEMGEN_OK;
}

static void ref_close(void *instance) {
  struct instance *in = instance;
  while (in->objs != NULL) {
    struct obj *o = in->objs;
    if ((o->kind == K_ALLOC || o->kind == K_RES) && o->base != NULL) {
      munmap(o->base, o->size);
    }
    if (o->kind == K_BACKING && o->fd >= 0) {
      close(o->fd);
    }
    drop(in, o);
  }
  while (in->spare != NULL) {
    struct obj *o = in->spare;
    in->spare = o->next;
    free(o);
  }
  pthread_mutex_destroy(&in->mu);
  free(in);
}

/* ---- DeviceAllocator --------------------------------------------------- */

static memgen_status ref_allocate(void *instance, uint64_t deadline_ns, const memgen_alloc_request *req,
                                  memgen_allocation_out *out) {
  struct instance *in = instance;
  uint64_t size = req->size == 0 ? 0 : round_up(req->size, page_size());
  uint64_t align = req->align;
  void *p;
  struct obj *o;
#ifdef REFHOST_BAD_STATUS
  return 4242; /* not a status of the header */
#endif
  (void)deadline_ns; /* mmap and populate are bounded */
  if (size == 0) {
    return fail(MEMGEN_ERR_INVALID_SIZE, "size 0 or over the limit");
  }
  if (align > page_size() && ((align & (align - 1)) != 0 || align > ((uint64_t)1 << 30))) {
    return fail(MEMGEN_ERR_INVALID_SIZE, "align is not a power of two of at most 2^30");
  }
  p = map_aligned(size, align, PROT_READ | PROT_WRITE, 0);
  if (p == NULL) {
    return MEMGEN_ERR_OUT_OF_MEMORY;
  }
  if (populate(p, size) != 0) {
    munmap(p, size);
    return MEMGEN_ERR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&in->mu);
  o = add(in, K_ALLOC, out->id);
  if (o == NULL) {
    pthread_mutex_unlock(&in->mu);
    munmap(p, size);
    return MEMGEN_ERR_OUT_OF_MEMORY;
  }
  o->base = p;
  o->size = size;
  in->used += size;
  out->addr = (memgen_device_addr)(uintptr_t)p;
  out->size = size;
#ifdef REFHOST_OVERLAP
  for (struct obj *x = o->next; x != NULL; x = x->next) {
    if (x->kind == K_ALLOC && x->size >= size) {
      out->addr = (memgen_device_addr)(uintptr_t)x->base; /* another live allocation's memory */
      break;
    }
  }
#endif
#ifdef REFHOST_OVERRUN_OUT
  memset((unsigned char *)out + sizeof *out, 0xa5, 64); /* past the out struct */
#endif
#ifdef REFHOST_BAD_HANDLE
  out->size = size / 2; /* less than asked for: garbage */
#endif
  pthread_mutex_unlock(&in->mu);
  return MEMGEN_OK;
}

static memgen_status ref_free(void *instance, memgen_handle a) {
  struct instance *in = instance;
  struct obj *o;
  memgen_status st = MEMGEN_OK;
  pthread_mutex_lock(&in->mu);
  o = find(in, a, K_ALLOC);
  if (o == NULL) {
    st = MEMGEN_ERR_RELEASED;
  } else if (munmap(o->base, o->size) != 0) {
    st = MEMGEN_ERR_INVALID_RANGE;
  } else {
    in->used -= o->size;
    drop(in, o);
  }
  pthread_mutex_unlock(&in->mu);
  return st;
}

static memgen_bytes ref_used_bytes(void *instance) {
  struct instance *in = instance;
  memgen_bytes n;
  pthread_mutex_lock(&in->mu);
  n = in->used;
  pthread_mutex_unlock(&in->mu);
  return n;
}

/* ---- VirtualBacking ---------------------------------------------------- */

static memgen_status ref_reserve(void *instance, const memgen_reserve_request *req, memgen_reservation_out *out) {
  struct instance *in = instance;
  uint64_t g = in->gran, size = req->size == 0 ? 0 : round_up(req->size, g);
  struct obj **grans;
  struct obj *o;
  void *p;
  if (size == 0) {
    return MEMGEN_ERR_INVALID_SIZE;
  }
  grans = calloc(size / g, sizeof *grans);
  if (grans == NULL) {
    return MEMGEN_ERR_OUT_OF_MEMORY;
  }
  p = map_aligned(size, g, PROT_NONE, MAP_NORESERVE);
  if (p == NULL) {
    free(grans);
    return MEMGEN_ERR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&in->mu);
  o = add(in, K_RES, out->id);
  if (o == NULL) {
    pthread_mutex_unlock(&in->mu);
    munmap(p, size);
    free(grans);
    return MEMGEN_ERR_OUT_OF_MEMORY;
  }
  o->base = p;
  o->size = size;
  o->gsz = g;
  o->gran = grans;
  out->addr = (memgen_device_addr)(uintptr_t)p;
  out->size = size;
  pthread_mutex_unlock(&in->mu);
  return MEMGEN_OK;
}

/* check_range validates r against reservation o: inside, then aligned. */
static memgen_status check_range(const struct obj *o, const memgen_range *r) {
  uint64_t g = o->gsz;
  if (r->len == 0 || r->off > o->size || r->len > o->size - r->off) {
    return MEMGEN_ERR_INVALID_RANGE;
  }
  if (r->off % g != 0 || r->len % g != 0) {
    return MEMGEN_ERR_UNALIGNED;
  }
  return MEMGEN_OK;
}

/* all_granules reports whether every granule of r in o is want. */
static int all_granules(const struct obj *o, const memgen_range *r, const struct obj *want) {
  uint64_t i, g = o->gsz;
  for (i = r->off / g; i < (r->off + r->len) / g; i++) {
    if (o->gran[i] != want) {
      return 0;
    }
  }
  return 1;
}

static void set_granules(struct obj *o, uint64_t off, uint64_t len, struct obj *to) {
  uint64_t i, g = o->gsz;
  for (i = off / g; i < (off + len) / g; i++) {
    o->gran[i] = to;
  }
}

static memgen_status ref_commit(void *instance, uint64_t deadline_ns, memgen_handle res, const memgen_range *r) {
  struct instance *in = instance;
  struct obj *o;
  memgen_status st;
  (void)deadline_ns; /* mprotect and populate are bounded */
#ifdef REFHOST_HANG_COMMIT
  for (;;) { /* never returns, whatever the deadline */
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
  }
#endif
  pthread_mutex_lock(&in->mu);
  o = find(in, res, K_RES);
  if (o == NULL) {
    st = MEMGEN_ERR_RELEASED;
    goto out;
  }
  if ((st = check_range(o, r)) != MEMGEN_OK) {
    goto out;
  }
  if (!all_granules(o, r, G_NONE)) {
    st = MEMGEN_ERR_COMMITTED;
    goto out;
  }
#ifdef REFHOST_BAD_COMMIT
  goto out; /* reports success, installs nothing */
#endif
#ifdef REFHOST_UNMAPPED_COMMIT
  set_granules(o, r->off, r->len, G_COMMITTED); /* marked and counted, never mapped */
  o->committed += r->len;
  in->used += r->len;
  goto out;
#endif
  if (mprotect(o->base + r->off, r->len, PROT_READ | PROT_WRITE) != 0) {
    st = errno_status(errno);
    goto out;
  }
  if (populate(o->base + r->off, r->len) != 0) {
    madvise(o->base + r->off, r->len, MADV_DONTNEED);
    mprotect(o->base + r->off, r->len, PROT_NONE);
    st = MEMGEN_ERR_OUT_OF_MEMORY;
    goto out;
  }
  set_granules(o, r->off, r->len, G_COMMITTED);
  o->committed += r->len;
  in->used += r->len;
out:
  pthread_mutex_unlock(&in->mu);
  return st;
}

static memgen_status ref_decommit(void *instance, memgen_handle res, const memgen_range *r) {
  struct instance *in = instance;
  struct obj *o;
  memgen_status st;
  pthread_mutex_lock(&in->mu);
  o = find(in, res, K_RES);
  if (o == NULL) {
    st = MEMGEN_ERR_RELEASED;
    goto out;
  }
  if ((st = check_range(o, r)) != MEMGEN_OK) {
    goto out;
  }
  if (!all_granules(o, r, G_COMMITTED)) {
    st = MEMGEN_ERR_NOT_COMMITTED;
    goto out;
  }
#ifdef REFHOST_BAD_DECOMMIT
  goto out; /* reports success, keeps the memory */
#endif
  if (mprotect(o->base + r->off, r->len, PROT_NONE) != 0) {
    st = MEMGEN_ERR_INVALID_RANGE;
    goto out;
  }
  if (madvise(o->base + r->off, r->len, MADV_DONTNEED) != 0) {
    mprotect(o->base + r->off, r->len, PROT_READ | PROT_WRITE);
    st = MEMGEN_ERR_INVALID_RANGE;
    goto out;
  }
  set_granules(o, r->off, r->len, G_NONE);
  o->committed -= r->len;
  in->used -= r->len;
out:
  pthread_mutex_unlock(&in->mu);
  return st;
}

static memgen_status ref_committed_bytes(void *instance, memgen_handle res, memgen_bytes *out) {
  struct instance *in = instance;
  struct obj *o;
  memgen_status st = MEMGEN_OK;
  pthread_mutex_lock(&in->mu);
  o = find(in, res, K_RES);
  if (o == NULL) {
    st = MEMGEN_ERR_RELEASED;
  } else {
    *out = o->committed;
  }
  pthread_mutex_unlock(&in->mu);
  return st;
}

static memgen_status ref_release_reservation(void *instance, memgen_handle res) {
  struct instance *in = instance;
  struct obj *o;
  memgen_status st = MEMGEN_OK;
  pthread_mutex_lock(&in->mu);
  o = find(in, res, K_RES);
  if (o == NULL) {
    st = MEMGEN_ERR_RELEASED;
  } else if (o->views > 0) {
    st = MEMGEN_ERR_IN_USE;
  } else if (munmap(o->base, o->size) != 0) {
    st = MEMGEN_ERR_INVALID_RANGE;
  } else {
    in->used -= o->committed;
    drop(in, o);
  }
  pthread_mutex_unlock(&in->mu);
  return st;
}

/* ---- SharedMapping ----------------------------------------------------- */

static int new_memfd(uint64_t n) {
  int fd = memfd_create("memgen-refhost", MFD_CLOEXEC);
  if (fd < 0) {
    return -1;
  }
  if (ftruncate(fd, (off_t)n) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static memgen_status ref_create_backing(void *instance, uint64_t deadline_ns, memgen_bytes size,
                                        memgen_backing_out *out) {
  struct instance *in = instance;
  uint64_t n = size == 0 ? 0 : round_up(size, in->gran);
  struct obj *o;
  int fd;
  (void)deadline_ns;
  if (n == 0) {
    return MEMGEN_ERR_INVALID_SIZE;
  }
  fd = new_memfd(n);
  if (fd < 0) {
    return MEMGEN_ERR_OUT_OF_MEMORY;
  }
  if (fallocate(fd, 0, 0, (off_t)n) != 0) {
    close(fd);
    return MEMGEN_ERR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&in->mu);
  o = add(in, K_BACKING, out->id);
  if (o == NULL) {
    pthread_mutex_unlock(&in->mu);
    close(fd);
    return MEMGEN_ERR_OUT_OF_MEMORY;
  }
  o->fd = fd;
  o->size = n;
  in->used += n;
  out->size = n;
  pthread_mutex_unlock(&in->mu);
  return MEMGEN_OK;
}

static int prot_of(memgen_access a) { return a == MEMGEN_ACCESS_READ_WRITE ? PROT_READ | PROT_WRITE : PROT_READ; }

/* reserved_again puts PROT_NONE reserved space over [p, p+n): never a hole. */
static int reserved_again(unsigned char *p, uint64_t n) {
  return mmap(p, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED ? -1 : 0;
}

static memgen_status ref_map_view(void *instance, memgen_handle res, const memgen_range *r, memgen_handle b,
                                  memgen_access access, memgen_view_out *out) {
  struct instance *in = instance;
  struct obj *ro, *bo, *v;
  memgen_status st;
  pthread_mutex_lock(&in->mu);
  ro = find(in, res, K_RES);
  bo = find(in, b, K_BACKING);
  if (ro == NULL || bo == NULL) {
    st = MEMGEN_ERR_RELEASED;
    goto out;
  }
  if (access != MEMGEN_ACCESS_READ_ONLY && access != MEMGEN_ACCESS_READ_WRITE) {
    st = MEMGEN_ERR_UNSUPPORTED;
    goto out;
  }
  if ((st = check_range(ro, r)) != MEMGEN_OK) {
    goto out;
  }
  if (r->len != bo->size) {
    st = MEMGEN_ERR_INVALID_RANGE;
    goto out;
  }
  if (!all_granules(ro, r, G_NONE)) {
    st = MEMGEN_ERR_COMMITTED;
    goto out;
  }
  v = add(in, K_VIEW, out->id);
  if (v == NULL) {
    st = MEMGEN_ERR_OUT_OF_MEMORY;
    goto out;
  }
  if (mmap(ro->base + r->off, r->len, prot_of(access), MAP_SHARED | MAP_FIXED, bo->fd, 0) == MAP_FAILED) {
    st = errno_status(errno);
    reserved_again(ro->base + r->off, r->len);
    drop(in, v);
    goto out;
  }
  v->res = ro;
  v->backing = bo;
  v->off = r->off;
  v->size = r->len;
  v->access = access;
  set_granules(ro, r->off, r->len, v);
  ro->views++;
  bo->mapped++;
  out->reservation = ro->id;
  out->range = *r;
  out->backing = bo->id;
  out->access = access;
out:
  pthread_mutex_unlock(&in->mu);
  return st;
}

static memgen_status ref_unmap_view(void *instance, memgen_handle vid) {
  struct instance *in = instance;
  struct obj *v;
  memgen_status st = MEMGEN_OK;
  pthread_mutex_lock(&in->mu);
  v = find(in, vid, K_VIEW);
  if (v == NULL) {
    st = MEMGEN_ERR_RELEASED;
  } else if (reserved_again(v->res->base + v->off, v->size) != 0) {
    st = MEMGEN_ERR_INVALID_RANGE;
  } else {
    set_granules(v->res, v->off, v->size, G_NONE);
    v->res->views--;
    v->backing->mapped--;
    drop(in, v);
  }
  pthread_mutex_unlock(&in->mu);
  return st;
}

static memgen_status ref_view_count(void *instance, memgen_handle b, int64_t *out) {
  struct instance *in = instance;
  struct obj *o;
  memgen_status st = MEMGEN_OK;
  pthread_mutex_lock(&in->mu);
  o = find(in, b, K_BACKING);
  if (o == NULL) {
    st = MEMGEN_ERR_RELEASED;
  } else {
    *out = (int64_t)o->mapped;
  }
  pthread_mutex_unlock(&in->mu);
  return st;
}

static memgen_status ref_release_backing(void *instance, memgen_handle b) {
  struct instance *in = instance;
  struct obj *o;
  memgen_status st = MEMGEN_OK;
  pthread_mutex_lock(&in->mu);
  o = find(in, b, K_BACKING);
  if (o == NULL) {
    st = MEMGEN_ERR_RELEASED;
  } else if (o->mapped > 0) {
    st = MEMGEN_ERR_IN_USE;
  } else {
    /* Closing the last reference to an unmapped memfd frees its pages. */
    close(o->fd);
    in->used -= o->size;
    drop(in, o);
  }
  pthread_mutex_unlock(&in->mu);
  return st;
}

static memgen_status ref_copy_on_write(void *instance, uint64_t deadline_ns, memgen_handle vid,
                                       memgen_view_out *out) {
  struct instance *in = instance;
  struct obj *v, *nb;
  unsigned char *p;
  uint64_t done = 0;
  memgen_status st = MEMGEN_OK;
  int fd;
  (void)deadline_ns;
  pthread_mutex_lock(&in->mu);
  v = find(in, vid, K_VIEW);
  if (v == NULL) {
    st = MEMGEN_ERR_RELEASED;
    goto out;
  }
  p = v->res->base + v->off;
  fd = new_memfd(v->size);
  if (fd < 0) {
    st = MEMGEN_ERR_OUT_OF_MEMORY;
    goto out;
  }
  while (done < v->size) {
    ssize_t n = pwrite(fd, p + done, v->size - done, (off_t)done);
    if (n <= 0) {
      close(fd);
      st = MEMGEN_ERR_OUT_OF_MEMORY;
      goto out;
    }
    done += (uint64_t)n;
  }
  nb = add(in, K_BACKING, out->backing);
  if (nb == NULL) {
    close(fd);
    st = MEMGEN_ERR_OUT_OF_MEMORY;
    goto out;
  }
  if (mmap(p, v->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    if (mmap(p, v->size, prot_of(v->access), MAP_SHARED | MAP_FIXED, v->backing->fd, 0) == MAP_FAILED) {
      reserved_again(p, v->size);
    }
    close(fd);
    drop(in, nb);
    st = MEMGEN_ERR_OUT_OF_MEMORY;
    goto out;
  }
  nb->fd = fd;
  nb->size = v->size;
  nb->mapped = 1;
  in->used += v->size;
  /* The view object stays (same granules) under a new id, of the new backing. */
  v->backing->mapped--;
  v->backing = nb;
  v->access = MEMGEN_ACCESS_READ_WRITE;
  v->id = out->id;
  out->reservation = v->res->id;
  out->range.off = v->off;
  out->range.len = v->size;
  out->backing = nb->id;
  out->access = MEMGEN_ACCESS_READ_WRITE;
out:
  pthread_mutex_unlock(&in->mu);
  return st;
}

/* ---- device context ---------------------------------------------------- */

/*
 * span returns the host pointer of [addr, addr+n) when every byte lies in
 * one allocation or reservation and is backed (and writable when write is
 * set), or NULL with *st saying why. The caller holds the mutex.
 */
static unsigned char *span(struct instance *in, memgen_device_addr addr, uint64_t n, int write, memgen_status *st) {
  struct obj *o;
  uint64_t i;
  for (o = in->objs; o != NULL; o = o->next) {
    uint64_t g = o->gsz;
    uint64_t base;
    if (o->kind != K_ALLOC && o->kind != K_RES) {
      continue;
    }
    base = (uint64_t)(uintptr_t)o->base;
    if (addr < base || addr - base >= o->size) {
      continue;
    }
    if (n > o->size - (addr - base)) {
      *st = MEMGEN_ERR_INVALID_RANGE;
      return NULL;
    }
    if (o->kind == K_RES) {
      for (i = (addr - base) / g; n > 0 && i <= (addr - base + n - 1) / g; i++) {
        if (o->gran[i] == G_NONE) {
          *st = MEMGEN_ERR_NOT_COMMITTED;
          return NULL;
        }
        if (write && o->gran[i] != G_COMMITTED && o->gran[i]->access != MEMGEN_ACCESS_READ_WRITE) {
          *st = MEMGEN_ERR_READ_ONLY;
          return NULL;
        }
      }
    }
    return o->base + (addr - base);
  }
  *st = MEMGEN_ERR_INVALID_RANGE;
  return NULL;
}

static memgen_status ref_stream_create(void *instance, memgen_handle *out_stream) {
  struct instance *in = instance;
  struct obj *o;
  memgen_status st = MEMGEN_OK;
  pthread_mutex_lock(&in->mu);
  o = add(in, K_STREAM, 0);
  if (o == NULL) {
    st = MEMGEN_ERR_OUT_OF_MEMORY;
  } else {
    *out_stream = o->id;
  }
  pthread_mutex_unlock(&in->mu);
  return st;
}

static memgen_status ref_copy(struct instance *in, memgen_handle stream, unsigned char *dst, memgen_device_addr dev_dst,
                              const unsigned char *src, memgen_device_addr dev_src, uint64_t n) {
  memgen_status st = MEMGEN_OK;
  pthread_mutex_lock(&in->mu);
  if (find(in, stream, K_STREAM) == NULL) {
    st = MEMGEN_ERR_CLOSED;
    goto out;
  }
  if (dst == NULL && (dst = span(in, dev_dst, n, 1, &st)) == NULL) {
    goto out;
  }
  if (src == NULL && (src = span(in, dev_src, n, 0, &st)) == NULL) {
    goto out;
  }
  memmove(dst, src, n);
out:
  pthread_mutex_unlock(&in->mu);
  return st;
}

static memgen_status ref_stream_copy_to_device(void *instance, memgen_handle stream, memgen_device_addr dst,
                                               const void *src, uint64_t src_len) {
  if (src_len == 0) {
    return MEMGEN_OK;
  }
  return ref_copy(instance, stream, NULL, dst, src, 0, src_len);
}

static memgen_status ref_stream_copy_from_device(void *instance, memgen_handle stream, void *dst, uint64_t dst_len,
                                                 memgen_device_addr src) {
  if (dst_len == 0) {
    return MEMGEN_OK;
  }
#ifdef REFHOST_OVERRUN_DST
  {
    memgen_status st = ref_copy(instance, stream, dst, 0, NULL, src, dst_len);
    memset((unsigned char *)dst + dst_len, 0xa5, 64); /* past the buffer */
    return st;
  }
#endif
  return ref_copy(instance, stream, dst, 0, NULL, src, dst_len);
}

static memgen_status ref_stream_copy_device(void *instance, memgen_handle stream, memgen_device_addr dst,
                                            memgen_device_addr src, memgen_bytes n) {
  if (n == 0) {
    return MEMGEN_OK;
  }
  return ref_copy(instance, stream, NULL, dst, NULL, src, n);
}

static memgen_status ref_stream_record(void *instance, memgen_handle stream, memgen_handle *out_fence) {
  struct instance *in = instance;
  struct obj *f;
  memgen_status st = MEMGEN_OK;
  pthread_mutex_lock(&in->mu);
  if (find(in, stream, K_STREAM) == NULL) {
    st = MEMGEN_ERR_CLOSED;
  } else if ((f = add(in, K_FENCE, 0)) == NULL) {
    st = MEMGEN_ERR_OUT_OF_MEMORY;
  } else {
    *out_fence = f->id; /* copies run synchronously: the fence is complete */
  }
  pthread_mutex_unlock(&in->mu);
  return st;
}

static memgen_status ref_stream_synchronize(void *instance, memgen_handle stream) {
  struct instance *in = instance;
  memgen_status st = MEMGEN_OK;
  pthread_mutex_lock(&in->mu);
  if (find(in, stream, K_STREAM) == NULL) {
    st = MEMGEN_ERR_CLOSED;
  }
  pthread_mutex_unlock(&in->mu);
  return st;
}

static memgen_status ref_stream_close(void *instance, memgen_handle stream) {
  struct instance *in = instance;
  struct obj *o;
  pthread_mutex_lock(&in->mu);
  o = find(in, stream, K_STREAM);
  if (o != NULL) {
    drop(in, o);
  }
  pthread_mutex_unlock(&in->mu);
  return MEMGEN_OK;
}

static memgen_status ref_fence_done(void *instance, memgen_handle fence, int32_t *out_done) {
  struct instance *in = instance;
  memgen_status st = MEMGEN_OK;
  pthread_mutex_lock(&in->mu);
  if (find(in, fence, K_FENCE) == NULL) {
    st = MEMGEN_ERR_RELEASED;
  } else {
    *out_done = 1;
  }
  pthread_mutex_unlock(&in->mu);
  return st;
}

static void ref_fence_release(void *instance, memgen_handle fence) {
  struct instance *in = instance;
  struct obj *o;
  pthread_mutex_lock(&in->mu);
  o = find(in, fence, K_FENCE);
  if (o != NULL) {
    drop(in, o);
  }
  pthread_mutex_unlock(&in->mu);
}

/*
 * refhost_count is not part of the ABI: the tests call it to count an
 * instance's live objects of one kind (6 = fences), which no slot reports,
 * or with kind 0 the freed objects kept for reuse.
 */
MEMGEN_EXPORT uint64_t refhost_count(void *instance, int32_t kind);
MEMGEN_EXPORT uint64_t refhost_count(void *instance, int32_t kind) {
  struct instance *in = instance;
  struct obj *o;
  uint64_t n = 0;
  pthread_mutex_lock(&in->mu);
  if (kind == 0) {
    n = in->nspare;
  }
  for (o = in->objs; o != NULL; o = o->next) {
    n += o->kind == (enum kind)kind;
  }
  pthread_mutex_unlock(&in->mu);
  return n;
}

/* ---- the descriptor ---------------------------------------------------- */

#ifdef REFHOST_NEWER_MINOR
/* A slot this build of the ABI appends; the host must never call it. */
static memgen_status ref_future_slot(void *instance) {
  (void)instance;
  abort();
}
#endif

/*
 * Each struct is wrapped so that a build emulating a newer minor can append
 * a slot the host does not know.
 */
struct ref_device_allocator {
  memgen_device_allocator base;
  memgen_status (*future)(void *instance);
};
struct ref_virtual_backing {
  memgen_virtual_backing base;
  memgen_status (*future)(void *instance);
};
struct ref_shared_mapping {
  memgen_shared_mapping base;
  memgen_status (*future)(void *instance);
};

#ifdef REFHOST_NEWER_MINOR
#define SIZE_OF(wrapper, member) ((uint32_t)sizeof(struct wrapper))
#define FUTURE ref_future_slot
#else
#define SIZE_OF(wrapper, member) ((uint32_t)sizeof(member))
#define FUTURE NULL
#endif

static const struct ref_device_allocator device_allocator = {
    {SIZE_OF(ref_device_allocator, memgen_device_allocator), REFHOST_SLOTS_VERSION, ref_allocate, ref_free, ref_used_bytes},
    FUTURE};

static const struct ref_virtual_backing virtual_backing = {
    {SIZE_OF(ref_virtual_backing, memgen_virtual_backing), REFHOST_SLOTS_VERSION, ref_reserve, ref_commit, ref_decommit,
     ref_committed_bytes, ref_release_reservation},
    FUTURE};

static const struct ref_shared_mapping shared_mapping = {
    {SIZE_OF(ref_shared_mapping, memgen_shared_mapping), REFHOST_SLOTS_VERSION, ref_create_backing, ref_map_view,
     ref_unmap_view, ref_copy_on_write, ref_view_count, ref_release_backing},
    FUTURE};

static const memgen_device_context device_context = {
    sizeof(memgen_device_context), REFHOST_SLOTS_VERSION,   ref_stream_create,      ref_stream_copy_to_device,
    ref_stream_copy_from_device,   ref_stream_copy_device, ref_stream_record, ref_stream_synchronize,
    ref_stream_close,              ref_fence_done,    ref_fence_release};

static memgen_plugin descriptor;
static pthread_once_t descriptor_once = PTHREAD_ONCE_INIT;

static void fill_descriptor(void) {
  page = (uint64_t)sysconf(_SC_PAGESIZE);
  descriptor.struct_size = sizeof descriptor;
#ifdef REFHOST_BAD_STRUCT_SIZE
  descriptor.struct_size = 16; /* smaller than any descriptor */
#endif
  descriptor.abi_version = REFHOST_VERSION;
#ifdef REFHOST_NAME
  descriptor.name = REFHOST_NAME;
#else
  descriptor.name = "refhost";
#endif
  descriptor.device = MEMGEN_DEVICE_KIND_HOST;
  descriptor.ordinal = 0;
  descriptor.alloc_granularity = page_size();
  descriptor.granularity = page_size();
  descriptor.open = ref_open;
  descriptor.close = ref_close;
  descriptor.last_error = ref_last_error;
  descriptor.device_allocator = &device_allocator.base;
  descriptor.virtual_backing = &virtual_backing.base;
  descriptor.shared_mapping = &shared_mapping.base;
  descriptor.device_context = &device_context;
}

#ifdef REFHOST_NO_ENTRY
#define ENTRY memgen_plugin_misnamed
const memgen_plugin *ENTRY(uint32_t host_abi_version);
#else
#define ENTRY memgen_plugin_v2
#endif

MEMGEN_EXPORT const memgen_plugin *ENTRY(uint32_t host_abi_version) {
  (void)host_abi_version;
#ifdef REFHOST_NULL_DESCRIPTOR
  return NULL;
#endif
  pthread_once(&descriptor_once, fill_descriptor);
  return &descriptor;
}
