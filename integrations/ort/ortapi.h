// memgen's own declarations of the part of ONNX Runtime's C API that the
// bridge (bridge.c, valuebridge.c, alloc_thunk.cc) uses: the opaque handle
// types, the enums it passes, OrtApiBase, OrtAllocator with every slot of
// API version 24, and OrtApi with the slots the bridge calls, each at its
// place in ONNX Runtime's table.
//
// It is not ONNX Runtime's header: it names only what this package needs,
// and ortapi_test.go compiles it beside the onnxruntime_c_api.h of the
// github.com/yalue/onnxruntime_go version in go.mod and fails on any
// difference (a slot's offset or type, OrtAllocator's layout, an enum
// constant, ORT_API_VERSION). Adding a slot: put it at its index, shrink
// the MEMGEN_ORT_SKIP ranges around it, run the test.
//
// ONNX Runtime is used on linux/x64 only (scripts/ort.sh), where its calling
// convention is the platform's own: ORT_API_CALL is empty.
#ifndef MEMGEN_ORT_ORTAPI_H
#define MEMGEN_ORT_ORTAPI_H

#include <stddef.h>
#include <stdint.h>

// The C API version the bridge asks OrtApiBase::GetApi for; ONNX Runtime
// 1.30.0 serves it. OrtAllocator::version is set to it too, telling ONNX
// Runtime which of the allocator's slots exist.
#define ORT_API_VERSION 24

#define ORT_API_CALL

#ifdef __cplusplus
extern "C" {
#endif

// ---- handles: ONNX Runtime allocates them, the bridge only passes them ----
typedef struct OrtEnv OrtEnv;
typedef struct OrtStatus OrtStatus; // NULL means success
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef struct OrtSession OrtSession;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtRunOptions OrtRunOptions;
typedef struct OrtValue OrtValue;
typedef struct OrtTypeInfo OrtTypeInfo;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtKeyValuePairs OrtKeyValuePairs; // string keys to string values (GetStats)
typedef struct OrtSyncStream OrtSyncStream;

// ---- enums, complete, with ONNX Runtime's values ----
typedef enum OrtErrorCode {
	ORT_OK = 0,
	ORT_FAIL = 1,
	ORT_INVALID_ARGUMENT = 2,
	ORT_NO_SUCHFILE = 3,
	ORT_NO_MODEL = 4,
	ORT_ENGINE_ERROR = 5,
	ORT_RUNTIME_EXCEPTION = 6,
	ORT_INVALID_PROTOBUF = 7,
	ORT_MODEL_LOADED = 8,
	ORT_NOT_IMPLEMENTED = 9,
	ORT_INVALID_GRAPH = 10,
	ORT_EP_FAIL = 11,
	ORT_MODEL_LOAD_CANCELED = 12,
	ORT_MODEL_REQUIRES_COMPILATION = 13,
	ORT_NOT_FOUND = 14,
} OrtErrorCode;

typedef enum OrtLoggingLevel {
	ORT_LOGGING_LEVEL_VERBOSE = 0,
	ORT_LOGGING_LEVEL_INFO = 1,
	ORT_LOGGING_LEVEL_WARNING = 2,
	ORT_LOGGING_LEVEL_ERROR = 3,
	ORT_LOGGING_LEVEL_FATAL = 4,
} OrtLoggingLevel;

// Whether an allocator is a plain device allocator or an arena.
typedef enum OrtAllocatorType {
	OrtInvalidAllocator = -1,
	OrtDeviceAllocator = 0,
	OrtArenaAllocator = 1,
	OrtReadOnlyAllocator = 2,
} OrtAllocatorType;

typedef enum OrtMemType {
	OrtMemTypeCPUInput = -2,
	OrtMemTypeCPUOutput = -1,
	OrtMemTypeCPU = -1, // the same as OrtMemTypeCPUOutput
	OrtMemTypeDefault = 0,
} OrtMemType;

// What an OrtValue holds.
typedef enum ONNXType {
	ONNX_TYPE_UNKNOWN = 0,
	ONNX_TYPE_TENSOR = 1,
	ONNX_TYPE_SEQUENCE = 2,
	ONNX_TYPE_MAP = 3,
	ONNX_TYPE_OPAQUE = 4,
	ONNX_TYPE_SPARSETENSOR = 5,
	ONNX_TYPE_OPTIONAL = 6,
} ONNXType;

// A tensor's element type: the numbering of the ONNX format's
// TensorProto.DataType.
typedef enum ONNXTensorElementDataType {
	ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED = 0,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT = 1,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 = 2,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 = 3,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16 = 4,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16 = 5,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 = 6,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 = 7,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING = 8,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL = 9,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 = 10,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE = 11,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32 = 12,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64 = 13,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX64 = 14,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX128 = 15,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 = 16,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN = 17,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FNUZ = 18,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E5M2 = 19,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E5M2FNUZ = 20,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT4 = 21,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_INT4 = 22,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT4E2M1 = 23,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT2 = 24,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_INT2 = 25,
} ONNXTensorElementDataType;

// How a session runs its graph's nodes: one after another, or independent
// ones at once on its inter-op threads.
typedef enum ExecutionMode {
	ORT_SEQUENTIAL = 0,
	ORT_PARALLEL = 1,
} ExecutionMode;

// ---- OrtAllocator: a table of functions the allocator's owner fills ----
// ONNX Runtime reads a slot only when version says it exists; a NULL
// optional slot means "not offered".
typedef struct OrtAllocator {
	uint32_t version; // the API version the table was written for
	void *(ORT_API_CALL *Alloc)(struct OrtAllocator *self, size_t size);
	void(ORT_API_CALL *Free)(struct OrtAllocator *self, void *p);
	const OrtMemoryInfo *(ORT_API_CALL *Info)(const struct OrtAllocator *self);
	// version 18: memory ONNX Runtime means to keep (initializers), outside
	// any arena.
	void *(ORT_API_CALL *Reserve)(struct OrtAllocator *self, size_t size);
	// version 23, optional: statistics as string pairs, made with
	// OrtApi::CreateKeyValuePairs; the caller releases them.
	OrtStatus *(ORT_API_CALL *GetStats)(const struct OrtAllocator *self, OrtKeyValuePairs **out);
	// version 23, optional: Alloc for work ordered on a stream.
	void *(ORT_API_CALL *AllocOnStream)(struct OrtAllocator *self, size_t size, OrtSyncStream *stream);
} OrtAllocator;

// ---- OrtApi: the function table of one API version ----
typedef struct OrtApi OrtApi;

// What the library's exported OrtGetApiBase returns.
typedef struct OrtApiBase {
	const OrtApi *(ORT_API_CALL *GetApi)(uint32_t version); // NULL when the version is not served
	const char *(ORT_API_CALL *GetVersionString)(void);
} OrtApiBase;

// MEMGEN_ORT_SKIP stands for the table's slots first..last, which the
// bridge does not call.
#define MEMGEN_ORT_SKIP(first, last) void *memgen_skip_##first##_##last[(last) - (first) + 1]

// Every slot returning OrtStatus * returns NULL on success, else a status
// the caller releases with ReleaseStatus. The number before a slot is its
// index in the table.
struct OrtApi {
	/* 0 */ OrtStatus *(*CreateStatus)(OrtErrorCode code, const char *msg);
	/* 1 */ OrtErrorCode (*GetErrorCode)(const OrtStatus *status);
	/* 2 */ const char *(*GetErrorMessage)(const OrtStatus *status);
	/* 3 */ OrtStatus *(*CreateEnv)(OrtLoggingLevel level, const char *logid, OrtEnv **out);
	MEMGEN_ORT_SKIP(4, 6);
	/* 7 */ OrtStatus *(*CreateSession)(const OrtEnv *env, const char *path, const OrtSessionOptions *opts,
	                                    OrtSession **out);
	MEMGEN_ORT_SKIP(8, 8);
	/* 9 */ OrtStatus *(*Run)(OrtSession *s, const OrtRunOptions *opts, const char *const *in_names,
	                          const OrtValue *const *in, size_t nin, const char *const *out_names, size_t nout,
	                          OrtValue **out);
	/* 10 */ OrtStatus *(*CreateSessionOptions)(OrtSessionOptions **out);
	MEMGEN_ORT_SKIP(11, 12);
	/* 13 */ OrtStatus *(*SetSessionExecutionMode)(OrtSessionOptions *opts, ExecutionMode mode);
	MEMGEN_ORT_SKIP(14, 16);
	// Without memory patterns a session allocates its intermediates on
	// every run instead of planning one block for them.
	/* 17 */ OrtStatus *(*DisableMemPattern)(OrtSessionOptions *opts);
	MEMGEN_ORT_SKIP(18, 23);
	/* 24 */ OrtStatus *(*SetIntraOpNumThreads)(OrtSessionOptions *opts, int threads);
	/* 25 */ OrtStatus *(*SetInterOpNumThreads)(OrtSessionOptions *opts, int threads);
	MEMGEN_ORT_SKIP(26, 29);
	/* 30 */ OrtStatus *(*SessionGetInputCount)(const OrtSession *s, size_t *n);
	/* 31 */ OrtStatus *(*SessionGetOutputCount)(const OrtSession *s, size_t *n);
	MEMGEN_ORT_SKIP(32, 32);
	/* 33 */ OrtStatus *(*SessionGetInputTypeInfo)(const OrtSession *s, size_t i, OrtTypeInfo **out);
	/* 34 */ OrtStatus *(*SessionGetOutputTypeInfo)(const OrtSession *s, size_t i, OrtTypeInfo **out);
	MEMGEN_ORT_SKIP(35, 35);
	// The name is allocated with a; free it with AllocatorFree.
	/* 36 */ OrtStatus *(*SessionGetInputName)(const OrtSession *s, size_t i, OrtAllocator *a, char **out);
	/* 37 */ OrtStatus *(*SessionGetOutputName)(const OrtSession *s, size_t i, OrtAllocator *a, char **out);
	MEMGEN_ORT_SKIP(38, 38);
	/* 39 */ OrtStatus *(*CreateRunOptions)(OrtRunOptions **out);
	MEMGEN_ORT_SKIP(40, 45);
	// A run whose options are set to terminate stops at its next node
	// with an error ("Exiting due to terminate flag being set to true").
	/* 46 */ OrtStatus *(*RunOptionsSetTerminate)(OrtRunOptions *opts);
	/* 47 */ OrtStatus *(*RunOptionsUnsetTerminate)(OrtRunOptions *opts);
	/* 48 */ OrtStatus *(*CreateTensorAsOrtValue)(OrtAllocator *a, const int64_t *shape, size_t rank,
	                                             ONNXTensorElementDataType type, OrtValue **out);
	// A tensor over memory the caller owns (p_data, p_data_len bytes, which
	// must cover the shape): ONNX Runtime reads and writes it in place and
	// never frees it; the memory must outlive the value and its runs.
	/* 49 */ OrtStatus *(*CreateTensorWithDataAsOrtValue)(const OrtMemoryInfo *info, void *p_data, size_t p_data_len,
	                                                     const int64_t *shape, size_t shape_len,
	                                                     ONNXTensorElementDataType type, OrtValue **out);
	MEMGEN_ORT_SKIP(50, 50);
	/* 51 */ OrtStatus *(*GetTensorMutableData)(OrtValue *v, void **out);
	/* 52 */ OrtStatus *(*FillStringTensor)(OrtValue *v, const char *const *strs, size_t n);
	MEMGEN_ORT_SKIP(53, 54);
	// The result belongs to the OrtTypeInfo.
	/* 55 */ OrtStatus *(*CastTypeInfoToTensorInfo)(const OrtTypeInfo *ti, const OrtTensorTypeAndShapeInfo **out);
	/* 56 */ OrtStatus *(*GetOnnxTypeFromTypeInfo)(const OrtTypeInfo *ti, enum ONNXType *out);
	MEMGEN_ORT_SKIP(57, 59);
	/* 60 */ OrtStatus *(*GetTensorElementType)(const OrtTensorTypeAndShapeInfo *info,
	                                           enum ONNXTensorElementDataType *out);
	/* 61 */ OrtStatus *(*GetDimensionsCount)(const OrtTensorTypeAndShapeInfo *info, size_t *out);
	/* 62 */ OrtStatus *(*GetDimensions)(const OrtTensorTypeAndShapeInfo *info, int64_t *dims, size_t n);
	MEMGEN_ORT_SKIP(63, 63);
	/* 64 */ OrtStatus *(*GetTensorShapeElementCount)(const OrtTensorTypeAndShapeInfo *info, size_t *out);
	/* 65 */ OrtStatus *(*GetTensorTypeAndShape)(const OrtValue *v, OrtTensorTypeAndShapeInfo **out);
	MEMGEN_ORT_SKIP(66, 66);
	/* 67 */ OrtStatus *(*GetValueType)(const OrtValue *v, enum ONNXType *out);
	MEMGEN_ORT_SKIP(68, 68);
	/* 69 */ OrtStatus *(*CreateCpuMemoryInfo)(enum OrtAllocatorType type, enum OrtMemType mem, OrtMemoryInfo **out);
	MEMGEN_ORT_SKIP(70, 74);
	/* 75 */ OrtStatus *(*AllocatorAlloc)(OrtAllocator *a, size_t size, void **out);
	/* 76 */ OrtStatus *(*AllocatorFree)(OrtAllocator *a, void *p);
	MEMGEN_ORT_SKIP(77, 77);
	// ONNX Runtime's own CPU allocator; not to be released.
	/* 78 */ OrtStatus *(*GetAllocatorWithDefaultOptions)(OrtAllocator **out);
	MEMGEN_ORT_SKIP(79, 91);
	// The Release slots accept NULL.
	/* 92 */ void (*ReleaseEnv)(OrtEnv *env);
	/* 93 */ void (*ReleaseStatus)(OrtStatus *status);
	/* 94 */ void (*ReleaseMemoryInfo)(OrtMemoryInfo *info);
	/* 95 */ void (*ReleaseSession)(OrtSession *s);
	/* 96 */ void (*ReleaseValue)(OrtValue *v);
	/* 97 */ void (*ReleaseRunOptions)(OrtRunOptions *opts);
	/* 98 */ void (*ReleaseTypeInfo)(OrtTypeInfo *ti);
	/* 99 */ void (*ReleaseTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo *info);
	/* 100 */ void (*ReleaseSessionOptions)(OrtSessionOptions *opts);
	MEMGEN_ORT_SKIP(101, 126);
	/* 127 */ OrtStatus *(*GetStringTensorElementLength)(const OrtValue *v, size_t i, size_t *out);
	// Copies element i (n bytes, no terminating NUL) into buf.
	/* 128 */ OrtStatus *(*GetStringTensorElement)(const OrtValue *v, size_t n, size_t i, void *buf);
	MEMGEN_ORT_SKIP(129, 129);
	/* 130 */ OrtStatus *(*AddSessionConfigEntry)(OrtSessionOptions *opts, const char *key, const char *value);
	// The allocator session s uses for memory described by info (its arena,
	// or the registered env allocator); release it with ReleaseAllocator.
	/* 131 */ OrtStatus *(*CreateAllocator)(const OrtSession *s, const OrtMemoryInfo *info, OrtAllocator **out);
	/* 132 */ void (*ReleaseAllocator)(OrtAllocator *a);
	MEMGEN_ORT_SKIP(133, 175);
	// Shares a with every session of env that sets session.use_env_allocators;
	// the caller keeps a alive until UnregisterAllocator.
	/* 176 */ OrtStatus *(*RegisterAllocator)(OrtEnv *env, OrtAllocator *a);
	/* 177 */ OrtStatus *(*UnregisterAllocator)(OrtEnv *env, const OrtMemoryInfo *info);
	MEMGEN_ORT_SKIP(178, 294);
	// Key-value pairs (version 22): keys and values are copied in.
	/* 295 */ void (*CreateKeyValuePairs)(OrtKeyValuePairs **out);
	/* 296 */ void (*AddKeyValuePair)(OrtKeyValuePairs *kv, const char *key, const char *value);
	/* 297 */ const char *(*GetKeyValue)(const OrtKeyValuePairs *kv, const char *key); // NULL when absent
	/* 298 */ void (*GetKeyValuePairs)(const OrtKeyValuePairs *kv, const char *const **keys,
	                                   const char *const **values, size_t *n);
	/* 299 */ void (*RemoveKeyValuePair)(OrtKeyValuePairs *kv, const char *key);
	/* 300 */ void (*ReleaseKeyValuePairs)(OrtKeyValuePairs *kv);
	MEMGEN_ORT_SKIP(301, 318);
	// An allocator's GetStats (an empty set when it has none).
	/* 319 */ OrtStatus *(*AllocatorGetStats)(const OrtAllocator *a, OrtKeyValuePairs **out);
};

#undef MEMGEN_ORT_SKIP

#ifdef __cplusplus
}
#endif

#endif
