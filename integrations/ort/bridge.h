// The C half of the bridge between ONNX Runtime and a memgen binding: an
// OrtAllocator whose Alloc, Reserve, Free and Info call into Go.
#ifndef MEMGEN_ORT_BRIDGE_H
#define MEMGEN_ORT_BRIDGE_H

#include <stddef.h>
#include <stdint.h>

#include "front.h"
#include "ortapi.h"

// memgen_ort_allocator is an OrtAllocator followed by the id of the Go
// allocator it calls and its front cache (front.h). ONNX Runtime sees only
// the OrtAllocator part.
typedef struct memgen_ort_allocator {
	OrtAllocator base;
	uintptr_t id;
	OrtMemoryInfo *info;
	memgen_ort_front front;
} memgen_ort_allocator;

// memgen_ort_load opens the ONNX Runtime library at path (the same one
// onnxruntime_go opened: dlopen returns the loaded instance), takes the API
// of version ORT_API_VERSION and a reference to the process's OrtEnv. It
// returns NULL or an error message to free with free().
char *memgen_ort_load(const char *path);

// memgen_ort_unload drops the OrtEnv reference and the library handle.
void memgen_ort_unload(void);

// memgen_ort_version returns the loaded library's version string.
const char *memgen_ort_version(void);

// memgen_ort_new_allocator makes (and memgen_ort_register registers with the
// OrtEnv) an allocator that calls Go allocator id, its front cache set up
// with the pool's nclass class sizes, a byte cap and a per-bin depth
// (memgen_ort_front_init). Errors are messages to free with free().
memgen_ort_allocator *memgen_ort_new_allocator(uintptr_t id, const uint64_t *classes, int nclass, int64_t front_bytes,
                                               int front_depth, char **err);
char *memgen_ort_register(memgen_ort_allocator *a);
char *memgen_ort_unregister(memgen_ort_allocator *a);

// memgen_ort_alloc_call and memgen_ort_free_call call the allocator's
// function pointers as ONNX Runtime would (a refusal, thrown to ONNX
// Runtime, is NULL here); the benchmark of the C path uses them.
void *memgen_ort_alloc_call(memgen_ort_allocator *a, size_t size);
void *memgen_ort_reserve_call(memgen_ort_allocator *a, size_t size);
void memgen_ort_free_call(memgen_ort_allocator *a, void *p);
OrtAllocator *memgen_ort_base(memgen_ort_allocator *a);

// memgen_ort_alloc_free_loop calls a's Alloc and Free n times with size
// bytes through its function pointers; it returns n, the count done before
// a NULL, or -1 when an Alloc threw (a refusal).
long memgen_ort_alloc_free_loop(OrtAllocator *a, size_t size, long n);

// memgen_ort_front_stress runs nthreads pthreads that each make iters
// Alloc (sizes 1 to 64 KiB and a few larger) and Free calls through a's
// function pointers, holding up to 16 blocks at a time and checking a
// pattern written into each block at its Free. It returns the number of
// errors (refusals, overlapping blocks, a thread that failed to start).
long memgen_ort_front_stress(OrtAllocator *a, int nthreads, long iters);

// memgen_ort_callback_loop makes 2n cgo callbacks that do nothing (the
// cost of the two callbacks of one Alloc+Free).
long memgen_ort_callback_loop(long n);

// GetStats: the number of keys and each key's name (NULL out of range).
#define MEMGEN_ORT_NSTATS 9
const char *memgen_ort_stat_key(int i);

// memgen_ort_get_stats reads allocator a's statistics, through its own
// GetStats slot (via_api 0) or through OrtApi::AllocatorGetStats (via_api
// 1), into out (MEMGEN_ORT_NSTATS values, stat_keys' order); found[i] says
// whether key i was there. An error is a message to free with free().
char *memgen_ort_get_stats(OrtAllocator *a, int via_api, int64_t *out, int *found);

// memgen_ort_session_allocator wraps session s's CPU allocator
// (OrtApi::CreateAllocator); release it with memgen_ort_release_allocator.
char *memgen_ort_session_allocator(OrtSession *s, OrtAllocator **out);
void memgen_ort_release_allocator(OrtAllocator *a);

/* An ONNX Runtime failure as the Go side reads it (cErr): its code, the
 * unit separator, "prefix: message"; st is released. */
char *memgen_ort_status_msg(const char *prefix, OrtStatus *st);

#endif

// ---- sessions and values for the conformance harness (valuebridge.c) ----
// onnxruntime_go cannot express scalar or empty tensors, nor read float16
// outputs in full; the ONNX conformance models need all three.

// memgen_ort_session_new loads the model at path with the options in flags
// (MEMGEN_ORT_*); threads > 0 sets the intra-op threads.
#define MEMGEN_ORT_ENV_ALLOCATORS 1    // session.use_env_allocators = 1
#define MEMGEN_ORT_NO_MEM_PATTERN 2    // DisableMemPattern: every run allocates its intermediates
#define MEMGEN_ORT_PARALLEL 4          // ORT_PARALLEL with 2 inter-op threads: nodes (and their allocations) on ONNX Runtime's own threads
char *memgen_ort_session_new(const char *path, int flags, int threads, OrtSession **out);
void memgen_ort_session_free(OrtSession *s);
char *memgen_ort_session_count(OrtSession *s, int outputs, size_t *n);
char *memgen_ort_session_io(OrtSession *s, int outputs, size_t i, char **name, int *onnx_type, int *elem_type);
char *memgen_ort_tensor_new(int elem_type, const int64_t *shape, size_t rank, const void *data, size_t nbytes,
                            char **strs, size_t nstrs, OrtValue **out);
void memgen_ort_value_free(OrtValue *v);
char *memgen_ort_run(OrtSession *s, OrtRunOptions *ro, const char **in_names, OrtValue **in, size_t nin,
                     const char **out_names, OrtValue **out, size_t nout);
/* A run's options (ro may be NULL in memgen_ort_run): terminate on stops a
 * run in flight at its next node, from any thread. */
char *memgen_ort_run_options_new(OrtRunOptions **out);
void memgen_ort_run_options_free(OrtRunOptions *ro);
char *memgen_ort_run_options_terminate(OrtRunOptions *ro, int on);
char *memgen_ort_value_info(OrtValue *v, int *onnx_type, int *elem_type, int64_t *shape, size_t cap, size_t *rank,
                            size_t *count, void **data);
char *memgen_ort_string_at(OrtValue *v, size_t i, char **s, size_t *len);

// ONNX Runtime's default CPU allocator (GetAllocatorWithDefaultOptions), a
// baseline of the Alloc+Free benchmark.
char *memgen_ort_default_allocator(OrtAllocator **out);

// ---- tensors over memory the caller owns: the decoder's KV cache (kvbridge.c) ----

// memgen_ort_value_over makes a tensor of elem_type and shape over nbytes
// at data (OrtApi::CreateTensorWithDataAsOrtValue, CPU memory): ONNX
// Runtime reads and writes it in place and never frees it. data is an
// address (a region's, or C memory), passed as an integer.
char *memgen_ort_value_over(uintptr_t data, size_t nbytes, const int64_t *shape, size_t rank, int elem_type,
                            OrtValue **out);
// memgen_ort_value_data returns the address of v's data.
char *memgen_ort_value_data(OrtValue *v, void **data);
// memgen_ort_session_dims returns the declared dimensions of session input
// (outputs 0) or output (outputs 1) i; a symbolic dimension is -1.
char *memgen_ort_session_dims(OrtSession *s, int outputs, size_t i, int64_t *dims, size_t cap, size_t *rank);

// memgen_ort_values_made counts the OrtValues this package made, by
// memgen_ort_value_over and memgen_ort_tensor_new (memgen_ort_count_value),
// since the process started; ONNX Runtime's own (outputs it allocates) are
// not counted.
long memgen_ort_values_made(void);
void memgen_ort_count_value(void);
// memgen_ort_zero writes n zero bytes at address p (the tests).
void memgen_ort_zero(uintptr_t p, size_t n);
