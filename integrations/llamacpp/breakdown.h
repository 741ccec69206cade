/*
 * The memory llama.cpp sizes for a context, per buffer type: what its
 * llama_get_memory_breakdown reports (the weights, the KV cache and the
 * compute buffers), read through a small C++ shim (breakdown.cpp) because
 * llama.cpp offers it only as a C++ function returning a std::map.
 */
#ifndef MEMGEN_LLAMA_BREAKDOWN_H
#define MEMGEN_LLAMA_BREAKDOWN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct llama_context;

/* One buffer type's bytes. */
struct memgen_llama_mem {
	char name[64]; /* the buffer type's name (ggml_backend_buft_name) */
	uint64_t model;   /* the weights */
	uint64_t context; /* the KV cache */
	uint64_t compute; /* the scheduler's compute buffers */
};

/* memgen_llama_breakdown writes up to cap entries of ctx's breakdown into
 * out and returns how many there are (more than cap when out was too
 * short), or -1 when lib (the dlopen handle of libllama) lacks the
 * functions. */
int memgen_llama_breakdown(void *lib, const struct llama_context *ctx, struct memgen_llama_mem *out, int cap);

#ifdef __cplusplus
}

#include <map>

struct ggml_backend_buffer_type;

/* The C++ side, as llama.cpp's src/llama-ext.h declares it (exported from
 * libllama, not in llama.h):
 *
 *	struct llama_memory_breakdown_data { size_t model = 0; size_t context = 0; size_t compute = 0; ... };
 *	using llama_memory_breakdown = std::map<ggml_backend_buffer_type_t, llama_memory_breakdown_data>;
 *	LLAMA_API llama_memory_breakdown llama_get_memory_breakdown(const struct llama_context * ctx);
 *
 * breakdown_data must stay layout-equal to llama_memory_breakdown_data and
 * breakdown_fn the function's type: TestBreakdownDeclarations compiles
 * these beside the release's header and checks both. */
namespace memgen {

struct breakdown_data {
	size_t model = 0;
	size_t context = 0;
	size_t compute = 0;
};

using breakdown = std::map<ggml_backend_buffer_type *, breakdown_data>;
using breakdown_fn = breakdown (*)(const llama_context *);

/* The mangled name of llama_get_memory_breakdown(const llama_context *)
 * (the Itanium C++ ABI, which GCC and Clang use on Linux). */
constexpr const char *breakdown_symbol = "_Z26llama_get_memory_breakdownPK13llama_context";

} // namespace memgen
#endif

#endif
