/*
 * The bridge between Go and llama.cpp: the library loaded with dlopen, the
 * llama calls the package makes, and memgen's ggml device and buffer type
 * (device.c), whose buffers take their memory from Go (pmm) through the
 * exported functions in buffer.go.
 */
#ifndef MEMGEN_LLAMA_BRIDGE_H
#define MEMGEN_LLAMA_BRIDGE_H

#include "breakdown.h"
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
	const struct llama_vocab *(*llama_model_get_vocab)(const struct llama_model *model);
	int32_t (*llama_tokenize)(const struct llama_vocab *vocab, const char *text, int32_t text_len, llama_token *tokens, int32_t n_tokens_max,
	                          bool add_special, bool parse_special);
	int32_t (*llama_token_to_piece)(const struct llama_vocab *vocab, llama_token token, char *buf, int32_t length, int32_t lstrip, bool special);
	bool (*llama_vocab_is_eog)(const struct llama_vocab *vocab, llama_token token);
	const char *(*llama_model_chat_template)(const struct llama_model *model, const char *name);
	int32_t (*llama_chat_apply_template)(const char *tmpl, const struct llama_chat_message *chat, size_t n_msg, bool add_ass, char *buf,
	                                     int32_t length);
	struct llama_sampler_chain_params (*llama_sampler_chain_default_params)(void);
	struct llama_sampler *(*llama_sampler_chain_init)(struct llama_sampler_chain_params params);
	void (*llama_sampler_chain_add)(struct llama_sampler *chain, struct llama_sampler *smpl);
	struct llama_sampler *(*llama_sampler_init_temp)(float t);
	struct llama_sampler *(*llama_sampler_init_dist)(uint32_t seed);
	llama_token (*llama_sampler_sample)(struct llama_sampler *smpl, struct llama_context *ctx, int32_t idx);
	void (*llama_sampler_free)(struct llama_sampler *smpl);
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
/* memgen_llama_set_max_buffer sets the largest buffer of the buffer type
 * (0: unlimited, the default). */
void memgen_llama_set_max_buffer(size_t n);
/* memgen_llama_swap_owner sets the Go object (a cgo.Handle) that the
 * buffer types' allocations on this thread are made for, and returns the
 * previous one. The bridge's calls below take the owner as an argument
 * and set it for their duration only. */
uintptr_t memgen_llama_swap_owner(uintptr_t owner);

/* Calls into llama.cpp. */
struct llama_model *memgen_llama_model_load(const char *path, int ours, uintptr_t owner);
void memgen_llama_model_free(struct llama_model *m);
/* memgen_llama_plan sizes, without allocating (llama_model_params.no_alloc),
 * the model at path and a stock context configured as
 * memgen_llama_context_new configures one, and writes what llama.cpp's
 * memory breakdown reports (memgen_llama_breakdown). It returns the
 * entries' count, -1 when the library lacks the breakdown, -2 when the
 * model does not load, -3 when the context cannot be made. heap is what
 * the C heap grew by while the model's metadata was loaded (the
 * vocabulary and the tensor table: what llama.cpp allocates, and fills,
 * for real even when its buffers are simulated). The context's growth is
 * left out: most of it is the scheduler's calloc'd tables, mapped but
 * never touched, so never resident. */
int memgen_llama_plan(const char *path, uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch, uint32_t n_seq, struct memgen_llama_mem *out, int cap,
                      uint64_t *heap);
/* abort_flag: llama_decode aborts (returns 2) once it is set, through
 * memgen_llama_set_flag, from any thread. */
/* n_seq: sequences, each with a KV stream of its own of n_ctx / n_seq cells. */
struct llama_context *memgen_llama_context_new(struct llama_model *m, uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch, uint32_t n_seq,
                                               int32_t n_threads, int *abort_flag, uintptr_t owner);
void memgen_llama_set_flag(int *flag, int v);
void memgen_llama_context_free(struct llama_context *c);
/* memgen_llama_decode decodes a batch of n tokens, token i at position
 * pos[i] of sequence seq[i], and returns llama_decode's status; for the
 * k-th token with out[i] set, next[k] is the token after it: drawn by
 * samplers[k] when it is set, else the greedy one (the argmax of its
 * logits over n_vocab), whose logit is top[2k]; the runner-up (the most
 * of the other logits) is second[k], its logit top[2k+1] (a sampled
 * token has second[k] -1). */
int32_t memgen_llama_decode(struct llama_context *c, int32_t n, llama_token *tokens, llama_pos *pos, llama_seq_id *seq, int8_t *out,
                            struct llama_sampler **samplers, int32_t n_vocab, llama_token *next, float *top, llama_token *second,
                            uintptr_t owner);

/* The model's vocabulary (a model without a tokenizer has none of use). */
/* memgen_llama_tokenize writes at most max tokens of text (special tokens
 * parsed, BOS added when add_special and the vocabulary asks for it) and
 * returns their count, or minus the count needed when max is too small. */
int32_t memgen_llama_tokenize(struct llama_model *m, const char *text, int32_t len, llama_token *out, int32_t max, bool add_special);
/* memgen_llama_piece writes token t's text (special tokens not rendered)
 * and returns its length, or minus the length needed. */
int32_t memgen_llama_piece(struct llama_model *m, llama_token t, char *buf, int32_t len);
bool memgen_llama_is_eog(struct llama_model *m, llama_token t);
/* memgen_llama_chat_template is the model's chat template (NULL: none). */
const char *memgen_llama_chat_template(struct llama_model *m);
/* memgen_llama_chat_apply formats n messages with tmpl, ending with the
 * assistant's turn, and returns the length (more than len: call again
 * with that much room), or a negative value for a template llama.cpp does
 * not know. */
int32_t memgen_llama_chat_apply(const char *tmpl, const char **roles, const char **contents, size_t n, char *buf, int32_t len);

/* Samplers: temperature then a seeded draw. */
struct llama_sampler *memgen_llama_sampler_new(float temp, uint32_t seed);
void memgen_llama_sampler_free(struct llama_sampler *s);
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
