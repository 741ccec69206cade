/*
 * memgen's ggml device: the CPU device's behaviour with a buffer type of its
 * own. llama.cpp gets it through llama_model_params.devices (public API), so
 * it places the layers' weights and KV cache in this buffer type; its
 * backend is the CPU backend (init_backend delegates), which computes on the
 * buffers because they are host memory (is_host). Every byte a buffer hands
 * out comes from Go (pmm), through the functions exported by buffer.go:
 *
 *   - a buffer made while a model loads is one pmm.Buffer, committed whole
 *     (the weights);
 *   - a buffer made while a context is created (the KV cache) is a pmm
 *     Region reserved for its size and never committed, and each tensor
 *     placed in it gets a Region of its own, reserved for the tensor's
 *     bytes: init_tensor points the tensor at it. Nothing is committed
 *     until Go grows the Region before a decode;
 *   - a buffer of the host buffer type (the device's host_buffer_type,
 *     which llama.cpp uses for the CPU backends' compute buffers and for
 *     a context's output buffer) is one pmm.Buffer, committed whole,
 *     charged to the context it is made for.
 *
 * The Go object a buffer is made for (its owner: a model being loaded, a
 * context being created or decoding) is per thread: each bridge call that
 * can allocate sets it for its own duration (memgen_llama_swap_owner), so
 * two contexts decoding at once on two threads each charge their own.
 *
 * A view of a tensor (view_src set) lives in its source's memory and
 * needs nothing.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_cgo_export.h"
#include "bridge.h"

struct buffer_ctx {
	void *base;
	uintptr_t handle; /* the Go buffer (cgo.Handle) */
	int kind;         /* BUF_KV: tensors get Regions of their own; BUF_WEIGHTS: tensors are recorded */
};

/* A buffer's kind, as memgenLlamaAlloc says it. */
enum { BUF_PLAIN = 0, BUF_KV = 1, BUF_WEIGHTS = 2 };

static __thread uintptr_t owner;

uintptr_t memgen_llama_swap_owner(uintptr_t o) {
	uintptr_t prev = owner;
	owner = o;
	return prev;
}

/* ---- buffer -------------------------------------------------------------- */

static void buf_free(ggml_backend_buffer_t b) {
	struct buffer_ctx *c = b->context;
	memgenLlamaFree(c->handle);
	free(c);
}

static void *buf_base(ggml_backend_buffer_t b) { return ((struct buffer_ctx *)b->context)->base; }

static enum ggml_status buf_init_tensor(ggml_backend_buffer_t b, struct ggml_tensor *t) {
	struct buffer_ctx *c = b->context;
	if (t->view_src != NULL || c->kind == BUF_PLAIN) return GGML_STATUS_SUCCESS;
	if (c->kind == BUF_WEIGHTS) {
		/* Go records where each weight lives (a level-2 sleep reloads
		 * it from the model file). */
		memgenLlamaWeightTensor(c->handle, t);
		return GGML_STATUS_SUCCESS;
	}
	uintptr_t addr = memgenLlamaInitTensor(c->handle, t);
	if (addr == 0) return GGML_STATUS_ALLOC_FAILED;
	t->data = (void *)addr;
	return GGML_STATUS_SUCCESS;
}

static void buf_memset(ggml_backend_buffer_t b, struct ggml_tensor *t, uint8_t v, size_t off, size_t n) {
	(void)b;
	memset((char *)t->data + off, v, n);
}

static void buf_set(ggml_backend_buffer_t b, struct ggml_tensor *t, const void *data, size_t off, size_t n) {
	(void)b;
	memcpy((char *)t->data + off, data, n);
}

static void buf_get(ggml_backend_buffer_t b, const struct ggml_tensor *t, void *data, size_t off, size_t n) {
	(void)b;
	memcpy(data, (const char *)t->data + off, n);
}

static bool buf_cpy(ggml_backend_buffer_t b, const struct ggml_tensor *src, struct ggml_tensor *dst) {
	(void)b;
	if (!memgen_llama_api.ggml_backend_buffer_is_host(src->buffer)) return false;
	memcpy(dst->data, src->data, memgen_llama_api.ggml_nbytes(src));
	return true;
}

static void buf_clear(ggml_backend_buffer_t b, uint8_t v) {
	struct buffer_ctx *c = b->context;
	if (c->kind == BUF_KV) {
		/* Only the committed rows of each tensor hold anything. */
		memgenLlamaClear(c->handle, v);
		return;
	}
	memset(c->base, v, b->size);
}

static const struct ggml_backend_buffer_i buffer_i = {
	.free_buffer = buf_free,
	.get_base = buf_base,
	.init_tensor = buf_init_tensor,
	.memset_tensor = buf_memset,
	.set_tensor = buf_set,
	.get_tensor = buf_get,
	.set_tensor_2d = NULL,
	.get_tensor_2d = NULL,
	.cpy_tensor = buf_cpy,
	.clear = buf_clear,
	.reset = NULL,
};

/* ---- buffer type --------------------------------------------------------- */

static const char *buft_name(ggml_backend_buffer_type_t t) {
	(void)t;
	return "memgen";
}

static struct ggml_backend_buffer_type host_buft;

static ggml_backend_buffer_t buft_alloc(ggml_backend_buffer_type_t t, size_t size) {
	struct buffer_ctx *c = calloc(1, sizeof *c);
	if (!c) return NULL;
	uintptr_t base = memgenLlamaAlloc(owner, size, t == &host_buft, &c->handle, &c->kind);
	if (base == 0) {
		free(c);
		return NULL;
	}
	c->base = (void *)base;
	ggml_backend_buffer_t b = memgen_llama_api.ggml_backend_buffer_init(t, buffer_i, c, size);
	if (!b) {
		memgenLlamaFree(c->handle);
		free(c);
	}
	return b;
}

static size_t buft_alignment(ggml_backend_buffer_type_t t) {
	(void)t;
	return 64;
}

/* The largest buffer of the device's buffer type: unlimited, or what
 * memgen_llama_set_max_buffer set (the tests spread the weights over
 * several buffers so). ggml splits a context's tensors over as many
 * buffers as it takes. */
static size_t max_buffer;

void memgen_llama_set_max_buffer(size_t n) { __atomic_store_n(&max_buffer, n, __ATOMIC_RELAXED); }

static size_t buft_max_size(ggml_backend_buffer_type_t t) {
	(void)t;
	size_t n = __atomic_load_n(&max_buffer, __ATOMIC_RELAXED);
	return n ? n : SIZE_MAX;
}

static bool buft_is_host(ggml_backend_buffer_type_t t) {
	(void)t;
	return true;
}

static struct ggml_backend_buffer_type buft = {
	.iface =
	    {
	        .get_name = buft_name,
	        .alloc_buffer = buft_alloc,
	        .get_alignment = buft_alignment,
	        .get_max_size = buft_max_size,
	        .get_alloc_size = NULL,
	        .is_host = buft_is_host,
	    },
	.device = NULL, /* set by memgen_llama_device */
	.context = NULL,
};

/* The host buffer type: the same buffers, asked for by llama.cpp for what
 * the CPU computes in (compute and output buffers). */
static const char *host_buft_name(ggml_backend_buffer_type_t t) {
	(void)t;
	return "memgen-host";
}

static struct ggml_backend_buffer_type host_buft = {
	.iface =
	    {
	        .get_name = host_buft_name,
	        .alloc_buffer = buft_alloc,
	        .get_alignment = buft_alignment,
	        .get_max_size = NULL,
	        .get_alloc_size = NULL,
	        .is_host = buft_is_host,
	    },
	.device = NULL, /* set by memgen_llama_device */
	.context = NULL,
};

ggml_backend_buffer_type_t memgen_llama_buft(void) { return &buft; }

/* ---- device and registry ------------------------------------------------- */

static ggml_backend_dev_t cpu(void) { return memgen_llama_api.cpu; }

static const char *dev_name(ggml_backend_dev_t d) {
	(void)d;
	return "memgen";
}

static const char *dev_description(ggml_backend_dev_t d) {
	(void)d;
	return "memgen: CPU compute over pmm regions";
}

static void dev_memory(ggml_backend_dev_t d, size_t *free_, size_t *total) {
	(void)d;
	cpu()->iface.get_memory(cpu(), free_, total);
}

static enum ggml_backend_dev_type dev_type(ggml_backend_dev_t d) {
	(void)d;
	/* An offload device to llama.cpp: the layers and their KV cache go to
	 * its buffer type. */
	return GGML_BACKEND_DEVICE_TYPE_GPU;
}

static void dev_props(ggml_backend_dev_t d, struct ggml_backend_dev_props *p) {
	memset(p, 0, sizeof *p);
	p->name = dev_name(d);
	p->description = dev_description(d);
	dev_memory(d, &p->memory_free, &p->memory_total);
	p->type = dev_type(d);
	p->device_id = NULL;
}

static ggml_backend_t dev_init_backend(ggml_backend_dev_t d, const char *params) {
	(void)d;
	return cpu()->iface.init_backend(cpu(), params);
}

static ggml_backend_buffer_type_t dev_buft(ggml_backend_dev_t d) {
	(void)d;
	return &buft;
}

static ggml_backend_buffer_type_t dev_host_buft(ggml_backend_dev_t d) {
	(void)d;
	return &host_buft;
}

static bool dev_supports_op(ggml_backend_dev_t d, const struct ggml_tensor *op) {
	(void)d;
	return cpu()->iface.supports_op(cpu(), op);
}

static bool dev_supports_buft(ggml_backend_dev_t d, ggml_backend_buffer_type_t t) {
	(void)d;
	return t == &buft || t == &host_buft || cpu()->iface.supports_buft(cpu(), t);
}

static const char *reg_name(ggml_backend_reg_t r) {
	(void)r;
	return "memgen";
}

static size_t reg_count(ggml_backend_reg_t r) {
	(void)r;
	return 1;
}

static ggml_backend_dev_t reg_device(ggml_backend_reg_t r, size_t i);

static void *reg_proc(ggml_backend_reg_t r, const char *name) {
	(void)r;
	(void)name;
	return NULL;
}

static struct ggml_backend_reg reg = {
	.api_version = MEMGEN_GGML_BACKEND_API_VERSION,
	.iface = {.get_name = reg_name, .get_device_count = reg_count, .get_device = reg_device, .get_proc_address = reg_proc},
	.context = NULL,
};

static struct ggml_backend_device dev = {
	.iface =
	    {
	        .get_name = dev_name,
	        .get_description = dev_description,
	        .get_memory = dev_memory,
	        .get_type = dev_type,
	        .get_props = dev_props,
	        .init_backend = dev_init_backend,
	        .get_buffer_type = dev_buft,
	        .get_host_buffer_type = dev_host_buft,
	        .buffer_from_host_ptr = NULL,
	        .supports_op = dev_supports_op,
	        .supports_buft = dev_supports_buft,
	        .offload_op = NULL,
	        .event_new = NULL,
	        .event_free = NULL,
	        .event_synchronize = NULL,
	    },
	.reg = &reg,
	.context = NULL,
};

static ggml_backend_dev_t reg_device(ggml_backend_reg_t r, size_t i) {
	(void)r;
	return i == 0 ? &dev : NULL;
}

ggml_backend_dev_t memgen_llama_device(void) {
	buft.device = &dev;
	host_buft.device = &dev;
	return &dev;
}
