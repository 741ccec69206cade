#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge.h"

struct memgen_llama_api memgen_llama_api;

static char *dupf(const char *format, const char *a, const char *b) {
	size_t n = strlen(format) + strlen(a) + strlen(b) + 1;
	char *s = malloc(n);
	if (s) snprintf(s, n, format, a, b);
	return s;
}

/* ---- logging ------------------------------------------------------------- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char last_error[1024];
static int verbose;
static enum ggml_log_level last_level;

static void log_cb(enum ggml_log_level level, const char *text, void *user) {
	(void)user;
	pthread_mutex_lock(&log_mu);
	if (level == GGML_LOG_LEVEL_CONT) level = last_level;
	last_level = level;
	if (level == GGML_LOG_LEVEL_ERROR) {
		size_t have = strlen(last_error);
		if (have > 0 && have + 1 < sizeof last_error && last_error[have - 1] == '\n') last_error[have++] = ' ', last_error[have] = 0;
		strncat(last_error, text, sizeof last_error - strlen(last_error) - 1);
	}
	if (verbose) fputs(text, stderr);
	pthread_mutex_unlock(&log_mu);
}

char *memgen_llama_take_error(void) {
	pthread_mutex_lock(&log_mu);
	size_t l = strlen(last_error);
	while (l > 0 && (last_error[l - 1] == '\n' || last_error[l - 1] == ' ')) last_error[--l] = 0;
	char *s = NULL;
	if (l > 0) s = strdup(last_error);
	last_error[0] = 0;
	pthread_mutex_unlock(&log_mu);
	return s;
}

void memgen_llama_set_verbose(int on) {
	pthread_mutex_lock(&log_mu);
	verbose = on;
	pthread_mutex_unlock(&log_mu);
}

/* ---- loading ------------------------------------------------------------- */

#define SYM(name)                                                                       \
	do {                                                                                \
		*(void **)&a->name = dlsym(h, #name);                                           \
		if (!a->name) return dupf("%s: no symbol %s", lib, #name);                      \
	} while (0)

char *memgen_llama_load(const char *lib, const char *dir) {
	struct memgen_llama_api *a = &memgen_llama_api;
	if (a->handle) return dupf("%s%s", "llama.cpp is already loaded from another path: ", lib);
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h) return dupf("%s%s", "dlopen: ", dlerror());
	SYM(llama_backend_init);
	SYM(llama_log_set);
	SYM(llama_model_default_params);
	SYM(llama_context_default_params);
	SYM(llama_model_load_from_file);
	SYM(llama_model_free);
	SYM(llama_init_from_model);
	SYM(llama_free);
	SYM(llama_decode);
	SYM(llama_get_logits_ith);
	SYM(llama_get_memory);
	SYM(llama_memory_clear);
	SYM(llama_memory_seq_rm);
	SYM(llama_model_get_vocab);
	SYM(llama_tokenize);
	SYM(llama_token_to_piece);
	SYM(llama_vocab_is_eog);
	SYM(llama_model_chat_template);
	SYM(llama_chat_apply_template);
	SYM(llama_sampler_chain_default_params);
	SYM(llama_sampler_chain_init);
	SYM(llama_sampler_chain_add);
	SYM(llama_sampler_init_temp);
	SYM(llama_sampler_init_dist);
	SYM(llama_sampler_sample);
	SYM(llama_sampler_free);
	SYM(ggml_backend_load_all_from_path);
	SYM(ggml_backend_dev_by_type);
	SYM(ggml_backend_buffer_init);
	SYM(ggml_backend_buffer_is_host);
	SYM(ggml_nbytes);
	a->llama_log_set(log_cb, NULL);
	a->ggml_backend_load_all_from_path(dir);
	a->cpu = a->ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
	if (!a->cpu) return dupf("%s: no CPU backend could be loaded from %s", lib, dir);
	a->llama_backend_init();
	a->handle = h;
	return NULL;
}

/* ---- llama calls --------------------------------------------------------- */

struct llama_model *memgen_llama_model_load(const char *path, int ours, uintptr_t owner) {
	struct memgen_llama_api *a = &memgen_llama_api;
	struct llama_model_params p = a->llama_model_default_params();
	/* Read the file into the weights' buffers: no mapping of it stays. */
	p.load_mode = LLAMA_LOAD_MODE_NONE;
	p.use_extra_bufts = false;
	ggml_backend_dev_t devs[2] = {NULL, NULL};
	/* The input layer's tensors (the token embeddings) stay on the CPU
	 * device in llama.cpp's plan; this override puts them in memgen's
	 * buffers too, so that every weight is in pmm. */
	struct llama_model_tensor_buft_override ov[2] = {{"token_embd", memgen_llama_buft()}, {NULL, NULL}};
	p.devices = devs; /* stock: no device, every layer on the CPU */
	p.n_gpu_layers = 0;
	if (ours) {
		devs[0] = memgen_llama_device();
		p.n_gpu_layers = -1; /* every layer on memgen's device */
		p.split_mode = LLAMA_SPLIT_MODE_LAYER;
		p.tensor_buft_overrides = ov;
	}
	uintptr_t prev = memgen_llama_swap_owner(owner);
	struct llama_model *m = a->llama_model_load_from_file(path, p);
	memgen_llama_swap_owner(prev);
	return m;
}

void memgen_llama_model_free(struct llama_model *m) { memgen_llama_api.llama_model_free(m); }

/* The stock configuration of a context, as memgen_llama_context_new makes
 * memgen's: the same n_ctx, batches, sequences and attention. */
static struct llama_context_params context_params(uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch, uint32_t n_seq, int32_t n_threads) {
	struct llama_context_params p = memgen_llama_api.llama_context_default_params();
	p.n_ctx = n_ctx;
	p.n_batch = n_batch;
	p.n_ubatch = n_ubatch;
	p.n_seq_max = n_seq;
	p.kv_unified = false;
	p.n_outputs_max = n_seq;
	p.n_threads = n_threads;
	p.n_threads_batch = n_threads;
	p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
	p.offload_kqv = true;
	p.no_perf = true;
	return p;
}

int memgen_llama_plan(const char *path, uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch, uint32_t n_seq, struct memgen_llama_mem *out, int cap,
                      uint64_t *heap) {
	struct memgen_llama_api *a = &memgen_llama_api;
	size_t before, after, sys;
	memgen_llama_c_heap(&before, &sys);
	struct llama_model_params mp = a->llama_model_default_params();
	mp.load_mode = LLAMA_LOAD_MODE_NONE;
	mp.use_extra_bufts = false;
	ggml_backend_dev_t devs[1] = {NULL};
	mp.devices = devs;
	mp.n_gpu_layers = 0;
	mp.no_alloc = true; /* the metadata only: every allocation simulated */
	struct llama_model *m = a->llama_model_load_from_file(path, mp);
	if (!m) return -2;
	memgen_llama_c_heap(&after, &sys);
	*heap = after > before ? after - before : 0;
	struct llama_context *c = a->llama_init_from_model(m, context_params(n_ctx, n_batch, n_ubatch, n_seq, 1));
	if (!c) {
		a->llama_model_free(m);
		return -3;
	}
	int n = memgen_llama_breakdown(a->handle, c, out, cap);
	a->llama_free(c);
	a->llama_model_free(m);
	return n;
}

/* A context's abort flag, read by llama.cpp's abort callback between the
 * graph's nodes: once Go sets it (the Decode's context ended), the running
 * llama_decode stops and returns 2. */
static bool memgen_llama_should_abort(void *flag) { return __atomic_load_n((int *)flag, __ATOMIC_RELAXED) != 0; }

void memgen_llama_set_flag(int *flag, int v) { __atomic_store_n(flag, v, __ATOMIC_RELAXED); }

struct llama_context *memgen_llama_context_new(struct llama_model *m, uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch, uint32_t n_seq, int32_t n_threads, int *abort_flag, uintptr_t owner) {
	struct memgen_llama_api *a = &memgen_llama_api;
	/* n_seq sequences, each in a KV stream of its own (n_ctx / n_seq
	 * cells): every (layer, sequence) range of K and V is contiguous.
	 * memgen_llama_decode reads the logits of each sequence's last token
	 * of a batch only: one output per sequence, so that the output buffer
	 * and the compute buffer's logits are sized for n_seq tokens, not
	 * n_batch. Flash attention: K and V are both one row per cell, so the
	 * part of each tensor in use is a prefix (see docs/llamacpp.md). */
	struct llama_context_params p = context_params(n_ctx, n_batch, n_ubatch, n_seq, n_threads);
	p.abort_callback = memgen_llama_should_abort;
	p.abort_callback_data = abort_flag;
	p.no_perf = true;
	uintptr_t prev = memgen_llama_swap_owner(owner);
	struct llama_context *c = a->llama_init_from_model(m, p);
	memgen_llama_swap_owner(prev);
	return c;
}

void memgen_llama_context_free(struct llama_context *c) { memgen_llama_api.llama_free(c); }

/* Decoding can allocate: llama.cpp grows a context's output buffer, and
 * its scheduler a compute buffer, when a graph needs more than reserved. */
int32_t memgen_llama_decode(struct llama_context *c, int32_t n, llama_token *tokens, llama_pos *pos, llama_seq_id *seq, int8_t *out,
                            struct llama_sampler **samplers, int32_t n_vocab, llama_token *next, float *top, llama_token *second,
                            uintptr_t owner) {
	struct memgen_llama_api *a = &memgen_llama_api;
	int32_t *n_seq_id = malloc(sizeof(int32_t) * (size_t)n);
	llama_seq_id **seq_id = malloc(sizeof(llama_seq_id *) * (size_t)n);
	if (!n_seq_id || !seq_id) {
		free(n_seq_id);
		free(seq_id);
		return -101;
	}
	for (int32_t i = 0; i < n; i++) {
		n_seq_id[i] = 1;
		seq_id[i] = &seq[i];
	}
	struct llama_batch b = {.n_tokens = n, .token = tokens, .embd = NULL, .pos = pos, .n_seq_id = n_seq_id, .seq_id = seq_id, .logits = out};
	uintptr_t prev = memgen_llama_swap_owner(owner);
	int32_t st = a->llama_decode(c, b);
	memgen_llama_swap_owner(prev);
	free(n_seq_id);
	free(seq_id);
	if (st != 0) return st;
	int32_t k = 0;
	for (int32_t i = 0; i < n; i++) {
		if (!out[i]) continue;
		if (samplers && samplers[k]) {
			next[k] = a->llama_sampler_sample(samplers[k], c, i);
			top[2 * k] = top[2 * k + 1] = 0;
			second[k] = -1;
			k++;
			continue;
		}
		const float *logits = a->llama_get_logits_ith(c, i);
		if (!logits) return -100;
		/* The argmax (the lowest index among equal logits) and the
		 * runner-up: the most of the others. */
		llama_token best = 0, next_best = -1;
		for (int32_t j = 1; j < n_vocab; j++) {
			if (logits[j] > logits[best]) {
				next_best = best;
				best = j;
			} else if (next_best < 0 || logits[j] > logits[next_best]) {
				next_best = j;
			}
		}
		top[2 * k] = logits[best];
		top[2 * k + 1] = next_best < 0 ? logits[best] : logits[next_best];
		second[k] = next_best;
		next[k++] = best;
	}
	return 0;
}

void memgen_llama_clear(struct llama_context *c) {
	struct memgen_llama_api *a = &memgen_llama_api;
	/* data=false: the cells go, the buffers are not written (their
	 * backing is decommitted by Go right after). */
	a->llama_memory_clear(a->llama_get_memory(c), false);
}

bool memgen_llama_seq_rm(struct llama_context *c, llama_seq_id seq, llama_pos p0) {
	struct memgen_llama_api *a = &memgen_llama_api;
	return a->llama_memory_seq_rm(a->llama_get_memory(c), seq, p0, -1);
}

void memgen_llama_memset(uintptr_t addr, int v, size_t n) { memset((void *)addr, v, n); }

size_t memgen_llama_nbytes(const struct ggml_tensor *t) { return memgen_llama_api.ggml_nbytes(t); }

void memgen_llama_c_heap(size_t *in_use, size_t *from_system) {
	struct mallinfo2 mi = mallinfo2();
	*in_use = mi.uordblks + mi.hblkhd;
	*from_system = mi.arena + mi.hblkhd;
}

/* ---- vocabulary, chat templates, samplers --------------------------------- */

int32_t memgen_llama_tokenize(struct llama_model *m, const char *text, int32_t len, llama_token *out, int32_t max, bool add_special) {
	struct memgen_llama_api *a = &memgen_llama_api;
	return a->llama_tokenize(a->llama_model_get_vocab(m), text, len, out, max, add_special, true);
}

int32_t memgen_llama_piece(struct llama_model *m, llama_token t, char *buf, int32_t len) {
	struct memgen_llama_api *a = &memgen_llama_api;
	return a->llama_token_to_piece(a->llama_model_get_vocab(m), t, buf, len, 0, false);
}

bool memgen_llama_is_eog(struct llama_model *m, llama_token t) {
	struct memgen_llama_api *a = &memgen_llama_api;
	return a->llama_vocab_is_eog(a->llama_model_get_vocab(m), t);
}

const char *memgen_llama_chat_template(struct llama_model *m) { return memgen_llama_api.llama_model_chat_template(m, NULL); }

int32_t memgen_llama_chat_apply(const char *tmpl, const char **roles, const char **contents, size_t n, char *buf, int32_t len) {
	struct llama_chat_message *msgs = calloc(n ? n : 1, sizeof *msgs);
	if (!msgs) return -2;
	for (size_t i = 0; i < n; i++) {
		msgs[i].role = roles[i];
		msgs[i].content = contents[i];
	}
	int32_t r = memgen_llama_api.llama_chat_apply_template(tmpl, msgs, n, true, buf, len);
	free(msgs);
	return r;
}

struct llama_sampler *memgen_llama_sampler_new(float temp, uint32_t seed) {
	struct memgen_llama_api *a = &memgen_llama_api;
	struct llama_sampler *ch = a->llama_sampler_chain_init(a->llama_sampler_chain_default_params());
	if (!ch) return NULL;
	a->llama_sampler_chain_add(ch, a->llama_sampler_init_temp(temp));
	a->llama_sampler_chain_add(ch, a->llama_sampler_init_dist(seed));
	return ch;
}

void memgen_llama_sampler_free(struct llama_sampler *s) { memgen_llama_api.llama_sampler_free(s); }
