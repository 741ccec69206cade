/*
 * The bridge between Go and llama.cpp: the library loaded with dlopen, the
 * llama calls the package makes, and memgen's ggml device and buffer type
 * (device.c), whose buffers take their memory from Go (pmm) through the
 * exported functions in buffer.go.
 */
#ifndef MEMGEN_LLAMA_BRIDGE_H
#define MEMGEN_LLAMA_BRIDGE_H

#include "llamaapi.h"

/* The functions of libllama and its ggml libraries that the bridge calls,
 * resolved with dlsym, as llama.h and ggml-backend.h declare them. */
struct memgen_llama_api {
	void *handle;
	ggml_backend_dev_t cpu;
	void (*llama_backend_init)(void);
	void (*llama_log_set)(ggml_log_callback cb, void *user_data);
	struct llama_model_params (*llama_model_default_params)(void);
	struct llama_context_params (*llama_context_default_params)(void);
	struct llama_model *(*llama_model_load_from_file)(const char *path, struct llama_model_params params);
	void (*llama_model_free)(struct llama_model *model);
	struct llama_context *(*llama_init_from_model)(struct llama_model *model, struct llama_context_params params);
	void (*llama_free)(struct llama_context *ctx);
	int32_t (*llama_decode)(struct llama_context *ctx, struct llama_batch batch);
	float *(*llama_get_logits_ith)(struct llama_context *ctx, int32_t i);
	llama_memory_t (*llama_get_memory)(const struct llama_context *ctx);
	void (*llama_memory_clear)(llama_memory_t mem, bool data);
	bool (*llama_memory_seq_rm)(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1);
	void (*ggml_backend_load_all_from_path)(const char *dir_path);
	ggml_backend_dev_t (*ggml_backend_dev_by_type)(enum ggml_backend_dev_type type);
	ggml_backend_buffer_t (*ggml_backend_buffer_init)(ggml_backend_buffer_type_t buft, struct ggml_backend_buffer_i iface,
	                                                  void *context, size_t size);
	bool (*ggml_backend_buffer_is_host)(ggml_backend_buffer_t buffer);
	size_t (*ggml_nbytes)(const struct ggml_tensor *tensor);
};
extern struct memgen_llama_api memgen_llama_api;

/* memgen_llama_load opens libllama at lib, loads ggml's CPU backend from
 * dir (the variant for this CPU) and resolves every function the bridge
 * calls. It returns NULL or a malloc'd message. */
char *memgen_llama_load(const char *lib, const char *dir);
/* memgen_llama_take_error returns the last error line llama.cpp logged (a
 * malloc'd copy; NULL when none) and forgets it. */
char *memgen_llama_take_error(void);
void memgen_llama_set_verbose(int on);

/* The device and its buffer type (device.c). */
ggml_backend_dev_t memgen_llama_device(void);
ggml_backend_buffer_type_t memgen_llama_buft(void);
/* memgen_llama_swap_owner sets the Go object (a cgo.Handle) that the
 * buffer types' allocations on this thread are made for, and returns the
 * previous one. The bridge's calls below take the owner as an argument
 * and set it for their duration only. */
uintptr_t memgen_llama_swap_owner(uintptr_t owner);

/* Calls into llama.cpp. */
struct llama_model *memgen_llama_model_load(const char *path, int ours, uintptr_t owner);
void memgen_llama_model_free(struct llama_model *m);
/* abort_flag: llama_decode aborts (returns 2) once it is set, through
 * memgen_llama_set_flag, from any thread. */
/* n_seq: sequences, each with a KV stream of its own of n_ctx / n_seq cells. */
struct llama_context *memgen_llama_context_new(struct llama_model *m, uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch, uint32_t n_seq,
                                               int32_t n_threads, int *abort_flag, uintptr_t owner);
void memgen_llama_set_flag(int *flag, int v);
void memgen_llama_context_free(struct llama_context *c);
/* memgen_llama_decode decodes a batch of n tokens, token i at position
 * pos[i] of sequence seq[i], and returns llama_decode's status; for each
 * token with out[i] set, in order, next holds the greedy token after it
 * (the argmax of its logits over n_vocab). */
int32_t memgen_llama_decode(struct llama_context *c, int32_t n, llama_token *tokens, llama_pos *pos, llama_seq_id *seq, int8_t *out,
                            int32_t n_vocab, llama_token *next, uintptr_t owner);
/* memgen_llama_clear drops the context's whole KV cache (its cells; the
 * buffers are not written). */
void memgen_llama_clear(struct llama_context *c);
/* memgen_llama_seq_rm drops the cells of sequence seq at positions [p0, end). */
bool memgen_llama_seq_rm(struct llama_context *c, llama_seq_id seq, llama_pos p0);

/* memgen_llama_nbytes is ggml_nbytes(t). */
size_t memgen_llama_nbytes(const struct ggml_tensor *t);
/* memgen_llama_memset sets n bytes at addr (committed memory of a KV
 * tensor) to v. */
void memgen_llama_memset(uintptr_t addr, int v, size_t n);
/* memgen_llama_c_heap reads glibc's malloc figures (mallinfo2, every
 * arena): the bytes in use and the bytes taken from the system (arenas and
 * mmapped chunks). */
void memgen_llama_c_heap(size_t *in_use, size_t *from_system);

#endif
