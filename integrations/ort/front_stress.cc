// The C threads of the front cache's concurrency test
// (TestFrontConcurrentThreads): ONNX Runtime calls Alloc and Free from its
// own threads, which Go did not create, so the test does too. In C++ so
// that a refused Alloc (thrown by alloc_thunk.cc) is caught.
#include <pthread.h>

#include <cstdint>
#include <cstring>
#include <new>

extern "C" {
#include "bridge.h"
}

namespace {

struct worker {
  OrtAllocator *a;
  long iters;
  uint64_t seed;
  long errors;
};

uint64_t next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

// A held block: its address, size and the tag written at both ends.
struct held {
  unsigned char *p;
  size_t size;
  uint64_t tag;
};

void mark(const held &h) {
  std::memcpy(h.p, &h.tag, sizeof h.tag);
  std::memcpy(h.p + h.size - sizeof h.tag, &h.tag, sizeof h.tag);
}

bool intact(const held &h) {
  uint64_t x, y;
  std::memcpy(&x, h.p, sizeof x);
  std::memcpy(&y, h.p + h.size - sizeof y, sizeof y);
  return x == h.tag && y == h.tag;
}

void *run(void *arg) {
  worker *w = static_cast<worker *>(arg);
  held slots[16] = {};
  for (long i = 0; i < w->iters; i++) {
    held &h = slots[next(&w->seed) % 16];
    if (h.p) {
      if (!intact(h)) w->errors++;  // another Alloc handed out an overlapping block
      w->a->Free(w->a, h.p);
      h.p = nullptr;
      continue;
    }
    uint64_t r = next(&w->seed);
    size_t size = r % 16 == 0 ? 64 * 1024 + 1 + r % (256 * 1024) : 16 + r % (64 * 1024 - 15);
    try {
      h.p = static_cast<unsigned char *>(w->a->Alloc(w->a, size));
    } catch (const std::bad_alloc &) {
      h.p = nullptr;
    }
    if (!h.p) {
      w->errors++;
      continue;
    }
    h.size = size;
    h.tag = w->seed;
    mark(h);
  }
  for (held &h : slots) {
    if (!h.p) continue;
    if (!intact(h)) w->errors++;
    w->a->Free(w->a, h.p);
  }
  return nullptr;
}

}  // namespace

extern "C" long memgen_ort_front_stress(OrtAllocator *a, int nthreads, long iters) {
  if (nthreads < 1 || nthreads > 64) return 1;
  pthread_t th[64];
  worker ws[64];
  bool ok[64];
  long errors = 0;
  for (int i = 0; i < nthreads; i++) {
    ws[i] = worker{a, iters, 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1), 0};
    ok[i] = pthread_create(&th[i], nullptr, run, &ws[i]) == 0;
    if (!ok[i]) errors++;
  }
  for (int i = 0; i < nthreads; i++) {
    if (!ok[i]) continue;
    pthread_join(th[i], nullptr);
    errors += ws[i].errors;
  }
  return errors;
}
