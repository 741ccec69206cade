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

}  // namespace

extern "C" void *memgen_ort_alloc_thunk(OrtAllocator *this_, size_t size) {
  uintptr_t id = reinterpret_cast<memgen_ort_allocator *>(this_)->id;
  char why[512];
  why[0] = 0;
  uintptr_t p = memgenOrtAlloc(id, size, why, sizeof why);
  if (p != 0) return reinterpret_cast<void *>(p);
  throw refused(std::string("memgen allocator refused the allocation: ") + why);
}

extern "C" void *memgen_ort_alloc_call(memgen_ort_allocator *a, size_t size) {
  try {
    return a->base.Alloc(&a->base, size);
  } catch (const std::bad_alloc &) {
    return nullptr;
  }
}
