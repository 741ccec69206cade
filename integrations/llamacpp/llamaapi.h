/*
 * memgen's own declarations of the part of llama.cpp's C API and of ggml's
 * backend interface that the bridge (bridge.c) uses. Every function is
 * reached through dlsym, so only types are declared here, and each is held
 * to upstream's llama.h and ggml-backend-impl.h by llamaapi_test.go (DWARF:
 * member offsets and types, struct sizes, enum values). An enum lists only
 * the constants this package uses (each with upstream's value); the
 * negative ones are kept so that the compiler gives the enum upstream's
 * signed type.
 */
#ifndef MEMGEN_LLAMAAPI_H
#define MEMGEN_LLAMAAPI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- ggml.h -------------------------------------------------------------- */

enum ggml_type {
	GGML_TYPE_F32 = 0,
	GGML_TYPE_F16 = 1,
};

enum ggml_op {
	GGML_OP_NONE = 0,
};

enum ggml_status {
	GGML_STATUS_ALLOC_FAILED = -2,
	GGML_STATUS_FAILED = -1,
	GGML_STATUS_SUCCESS = 0,
};

enum ggml_log_level {
	GGML_LOG_LEVEL_NONE = 0,
	GGML_LOG_LEVEL_ERROR = 4,
	GGML_LOG_LEVEL_CONT = 5,
};

typedef void (*ggml_log_callback)(enum ggml_log_level level, const char *text, void *user_data);
typedef bool (*ggml_abort_callback)(void *data);

struct ggml_tensor {
	enum ggml_type type;
	struct ggml_backend_buffer *buffer;
	int64_t ne[4];
	size_t nb[4];
	enum ggml_op op;
	int32_t op_params[16];
	int32_t flags;
	struct ggml_tensor *src[10];
	struct ggml_tensor *view_src;
	size_t view_offs;
	void *data;
	char name[64];
	void *extra;
	char padding[8];
};

/* ---- ggml-backend.h ------------------------------------------------------ */

typedef struct ggml_backend_buffer_type *ggml_backend_buffer_type_t;
typedef struct ggml_backend_buffer *ggml_backend_buffer_t;
typedef struct ggml_backend *ggml_backend_t;
typedef struct ggml_backend_event *ggml_backend_event_t;
typedef struct ggml_backend_reg *ggml_backend_reg_t;
typedef struct ggml_backend_device *ggml_backend_dev_t;

enum ggml_backend_buffer_usage {
	GGML_BACKEND_BUFFER_USAGE_ANY = 0,
	GGML_BACKEND_BUFFER_USAGE_WEIGHTS = 1,
	GGML_BACKEND_BUFFER_USAGE_COMPUTE = 2,
};

enum ggml_backend_dev_type {
	GGML_BACKEND_DEVICE_TYPE_CPU = 0,
	GGML_BACKEND_DEVICE_TYPE_GPU = 1,
};

struct ggml_backend_dev_caps {
	bool async;
	bool host_buffer;
	bool buffer_from_host_ptr;
	bool events;
	bool mmap_support;
};

struct ggml_backend_dev_props {
	const char *name;
	const char *description;
	size_t memory_free;
	size_t memory_total;
	enum ggml_backend_dev_type type;
	const char *device_id;
	struct ggml_backend_dev_caps caps;
};

typedef bool (*ggml_backend_sched_eval_callback)(struct ggml_tensor *t, bool ask, void *user_data);

/* ---- ggml-backend-impl.h ------------------------------------------------- */

struct ggml_backend_buffer_type_i {
	const char *(*get_name)(ggml_backend_buffer_type_t buft);
	ggml_backend_buffer_t (*alloc_buffer)(ggml_backend_buffer_type_t buft, size_t size);
	size_t (*get_alignment)(ggml_backend_buffer_type_t buft);
	size_t (*get_max_size)(ggml_backend_buffer_type_t buft);
	size_t (*get_alloc_size)(ggml_backend_buffer_type_t buft, const struct ggml_tensor *tensor);
	bool (*is_host)(ggml_backend_buffer_type_t buft);
};

struct ggml_backend_buffer_type {
	struct ggml_backend_buffer_type_i iface;
	ggml_backend_dev_t device;
	void *context;
};

struct ggml_backend_buffer_i {
	void (*free_buffer)(ggml_backend_buffer_t buffer);
	void *(*get_base)(ggml_backend_buffer_t buffer);
	enum ggml_status (*init_tensor)(ggml_backend_buffer_t buffer, struct ggml_tensor *tensor);
	void (*memset_tensor)(ggml_backend_buffer_t buffer, struct ggml_tensor *tensor, uint8_t value, size_t offset, size_t size);
	void (*set_tensor)(ggml_backend_buffer_t buffer, struct ggml_tensor *tensor, const void *data, size_t offset, size_t size);
	void (*get_tensor)(ggml_backend_buffer_t buffer, const struct ggml_tensor *tensor, void *data, size_t offset, size_t size);
	void (*set_tensor_2d)(ggml_backend_buffer_t buffer, struct ggml_tensor *tensor, const void *data, size_t offset, size_t size,
	                      size_t n_copies, size_t stride_tensor, size_t stride_data);
	void (*get_tensor_2d)(ggml_backend_buffer_t buffer, const struct ggml_tensor *tensor, void *data, size_t offset, size_t size,
	                      size_t n_copies, size_t stride_tensor, size_t stride_data);
	bool (*cpy_tensor)(ggml_backend_buffer_t buffer, const struct ggml_tensor *src, struct ggml_tensor *dst);
	void (*clear)(ggml_backend_buffer_t buffer, uint8_t value);
	void (*reset)(ggml_backend_buffer_t buffer);
};

struct ggml_backend_buffer {
	struct ggml_backend_buffer_i iface;
	ggml_backend_buffer_type_t buft;
	void *context;
	size_t size;
	enum ggml_backend_buffer_usage usage;
};

struct ggml_backend_device_i {
	const char *(*get_name)(ggml_backend_dev_t dev);
	const char *(*get_description)(ggml_backend_dev_t dev);
	void (*get_memory)(ggml_backend_dev_t dev, size_t *free, size_t *total);
	enum ggml_backend_dev_type (*get_type)(ggml_backend_dev_t dev);
	void (*get_props)(ggml_backend_dev_t dev, struct ggml_backend_dev_props *props);
	ggml_backend_t (*init_backend)(ggml_backend_dev_t dev, const char *params);
	ggml_backend_buffer_type_t (*get_buffer_type)(ggml_backend_dev_t dev);
	ggml_backend_buffer_type_t (*get_host_buffer_type)(ggml_backend_dev_t dev);
	ggml_backend_buffer_t (*buffer_from_host_ptr)(ggml_backend_dev_t dev, void *ptr, size_t size, size_t max_tensor_size);
	bool (*supports_op)(ggml_backend_dev_t dev, const struct ggml_tensor *op);
	bool (*supports_buft)(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft);
	bool (*offload_op)(ggml_backend_dev_t dev, const struct ggml_tensor *op);
	ggml_backend_event_t (*event_new)(ggml_backend_dev_t dev);
	void (*event_free)(ggml_backend_dev_t dev, ggml_backend_event_t event);
	void (*event_synchronize)(ggml_backend_dev_t dev, ggml_backend_event_t event);
};

struct ggml_backend_device {
	struct ggml_backend_device_i iface;
	ggml_backend_reg_t reg;
	void *context;
};

struct ggml_backend_reg_i {
	const char *(*get_name)(ggml_backend_reg_t reg);
	size_t (*get_device_count)(ggml_backend_reg_t reg);
	ggml_backend_dev_t (*get_device)(ggml_backend_reg_t reg, size_t index);
	void *(*get_proc_address)(ggml_backend_reg_t reg, const char *name);
};

struct ggml_backend_reg {
	int api_version;
	struct ggml_backend_reg_i iface;
	void *context;
};

/* GGML_BACKEND_API_VERSION, the version a registry declares. */
#define MEMGEN_GGML_BACKEND_API_VERSION 2

/* ---- llama.h ------------------------------------------------------------- */

struct llama_model;
struct llama_context;
struct llama_vocab;
struct llama_sampler;
struct llama_model_kv_override;
typedef struct llama_memory_i *llama_memory_t;

typedef int32_t llama_pos;
typedef int32_t llama_token;
typedef int32_t llama_seq_id;

enum llama_rope_scaling_type {
	LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED = -1,
};

enum llama_pooling_type {
	LLAMA_POOLING_TYPE_UNSPECIFIED = -1,
};

enum llama_attention_type {
	LLAMA_ATTENTION_TYPE_UNSPECIFIED = -1,
};

enum llama_flash_attn_type {
	LLAMA_FLASH_ATTN_TYPE_AUTO = -1,
	LLAMA_FLASH_ATTN_TYPE_DISABLED = 0,
	LLAMA_FLASH_ATTN_TYPE_ENABLED = 1,
};

enum llama_split_mode {
	LLAMA_SPLIT_MODE_NONE = 0,
	LLAMA_SPLIT_MODE_LAYER = 1,
};

enum llama_load_mode {
	LLAMA_LOAD_MODE_AUTO = -1,
	LLAMA_LOAD_MODE_NONE = 0,
	LLAMA_LOAD_MODE_MMAP = 1,
};

enum llama_lazy_mode {
	LLAMA_LAZY_MODE_OFF = 0,
};

enum llama_context_type {
	LLAMA_CONTEXT_TYPE_DEFAULT = 0,
};

typedef bool (*llama_progress_callback)(float progress, void *user_data);

typedef struct llama_chat_message {
	const char *role;
	const char *content;
} llama_chat_message;

typedef struct llama_sampler_chain_params {
	bool no_perf;
} llama_sampler_chain_params;

typedef struct llama_batch {
	int32_t n_tokens;
	llama_token *token;
	float *embd;
	llama_pos *pos;
	int32_t *n_seq_id;
	llama_seq_id **seq_id;
	int8_t *logits;
} llama_batch;

struct llama_model_tensor_buft_override {
	const char *pattern;
	ggml_backend_buffer_type_t buft;
};

struct llama_model_params {
	ggml_backend_dev_t *devices;
	const struct llama_model_tensor_buft_override *tensor_buft_overrides;
	int32_t n_gpu_layers;
	enum llama_split_mode split_mode;
	enum llama_load_mode load_mode;
	enum llama_lazy_mode lazy_mode;
	int32_t main_gpu;
	const float *tensor_split;
	llama_progress_callback progress_callback;
	void *progress_callback_user_data;
	const struct llama_model_kv_override *kv_overrides;
	bool vocab_only;
	bool check_tensors;
	bool use_extra_bufts;
	bool no_host;
	bool no_alloc;
	bool load_mtp;
};

struct llama_sampler_seq_config {
	llama_seq_id seq_id;
	struct llama_sampler *sampler;
};

struct llama_context_params {
	uint32_t n_ctx;
	uint32_t n_batch;
	uint32_t n_ubatch;
	uint32_t n_seq_max;
	uint32_t n_rs_seq;
	uint32_t n_outputs_max;
	uint32_t n_outputs_max_per_seq;
	int32_t n_threads;
	int32_t n_threads_batch;
	enum llama_context_type ctx_type;
	enum llama_rope_scaling_type rope_scaling_type;
	enum llama_pooling_type pooling_type;
	enum llama_attention_type attention_type;
	enum llama_flash_attn_type flash_attn_type;
	float rope_freq_base;
	float rope_freq_scale;
	float yarn_ext_factor;
	float yarn_attn_factor;
	float yarn_beta_fast;
	float yarn_beta_slow;
	uint32_t yarn_orig_ctx;
	float defrag_thold;
	ggml_backend_sched_eval_callback cb_eval;
	void *cb_eval_user_data;
	enum ggml_type type_k;
	enum ggml_type type_v;
	ggml_abort_callback abort_callback;
	void *abort_callback_data;
	bool embeddings;
	bool offload_kqv;
	bool no_perf;
	bool op_offload;
	bool swa_full;
	bool kv_unified;
	struct llama_sampler_seq_config *samplers;
	size_t n_samplers;
	struct llama_context *ctx_other;
};

#ifdef __cplusplus
}
#endif

#endif
