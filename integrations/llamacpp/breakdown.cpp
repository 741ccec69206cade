// The C++ side of breakdown.h: llama_get_memory_breakdown resolved by its
// mangled name with dlsym, its std::map copied into a C array.

#include <dlfcn.h>

#include <cstring>

#include "breakdown.h"

namespace memgen {
using buft_name_fn = const char *(*)(ggml_backend_buffer_type *);
} // namespace memgen

extern "C" int memgen_llama_breakdown(void *lib, const struct llama_context *ctx, struct memgen_llama_mem *out, int cap) {
	auto get = reinterpret_cast<memgen::breakdown_fn>(dlsym(lib, memgen::breakdown_symbol));
	auto name = reinterpret_cast<memgen::buft_name_fn>(dlsym(lib, "ggml_backend_buft_name"));
	if (get == nullptr || name == nullptr) {
		return -1;
	}
	try {
		memgen::breakdown b = get(ctx);
		int n = 0;
		for (const auto &[buft, d] : b) {
			if (n < cap) {
				memgen_llama_mem &m = out[n];
				std::memset(&m, 0, sizeof m);
				const char *s = buft ? name(buft) : "";
				std::strncpy(m.name, s ? s : "", sizeof m.name - 1);
				m.model = d.model;
				m.context = d.context;
				m.compute = d.compute;
			}
			n++;
		}
		return n;
	} catch (...) {
		return -1;
	}
}
