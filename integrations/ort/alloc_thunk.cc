// The Alloc and Reserve entry points ONNX Runtime calls, in C++ so that a
// refusal can be thrown. ONNX Runtime 1.30 uses the pointer a custom
// OrtAllocator returns without checking it for NULL in places (a refused
// Alloc during Run crashes it), while every ONNX Runtime entry point turns a
// std::exception into its error status, as it does for its own CPU
// allocator's failures. So a refused Alloc throws a std::bad_alloc whose
// message says why; ONNX Runtime reports it and the call fails cleanly.
#include <cstdint>
#include <cstdio>
#include <new>
#include <string>

extern "C" {
#include "bridge.h"
#include "_cgo_export.h"
}

namespace {

class refused : public std::bad_alloc {
 public:
  explicit refused(std::string msg) : msg_(std::move(msg)) {}
  const char *what() const noexcept override { return msg_.c_str(); }

 private:
  std::string msg_;
};

// call serves Alloc (reserve 0) from the front cache when it holds a block
// of the request's class, and otherwise, as Reserve (reserve 1), through
// Go; the front records what Go served.
void *call(OrtAllocator *this_, size_t size, int reserve) {
  memgen_ort_allocator *a = reinterpret_cast<memgen_ort_allocator *>(this_);
  if (!reserve) {
    if (void *p = memgen_ort_front_alloc(&a->front, size)) return p;
  }
  char why[512];
  why[0] = 0;
  uint64_t held = 0;
  uintptr_t p = memgenOrtAlloc(a->id, size, reserve, &held, why, sizeof why);
  if (p != 0) {
    memgen_ort_front_served(&a->front, reinterpret_cast<void *>(p), size, held, !reserve);
    return reinterpret_cast<void *>(p);
  }
  // A zero-byte request gets NULL, as OrtAllocator's contract says (ONNX
  // Runtime asks Reserve(0) for empty initializers, and its own CPU
  // allocator answers NULL too); Go recorded it as memapi.ErrInvalidSize.
  if (size == 0) return nullptr;
  throw refused(std::string("memgen allocator refused the allocation: ") + why);
}

}  // namespace

extern "C" void *memgen_ort_alloc_thunk(OrtAllocator *this_, size_t size) { return call(this_, size, 0); }

extern "C" void *memgen_ort_reserve_thunk(OrtAllocator *this_, size_t size) { return call(this_, size, 1); }

extern "C" void *memgen_ort_alloc_call(memgen_ort_allocator *a, size_t size) {
  try {
    return a->base.Alloc(&a->base, size);
  } catch (const std::bad_alloc &) {
    return nullptr;
  }
}

extern "C" void *memgen_ort_reserve_call(memgen_ort_allocator *a, size_t size) {
  try {
    return a->base.Reserve(&a->base, size);
  } catch (const std::bad_alloc &) {
    return nullptr;
  }
}

extern "C" long memgen_ort_alloc_free_loop(OrtAllocator *a, size_t size, long n) {
  try {
    for (long i = 0; i < n; i++) {
      void *p = a->Alloc(a, size);
      if (!p) return i;
      a->Free(a, p);
    }
  } catch (const std::bad_alloc &) {
    return -1;
  }
  return n;
}
