// Sessions and tensors over the C API for the conformance harness; see
// bridge.h.
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge.h"

extern const OrtApi *memgen_ort_api(void);

static char *fail(const char *where, OrtStatus *st) { return memgen_ort_status_msg(where, st); }

#define TRY(where, call)                       \
	do {                                       \
		OrtStatus *st_ = (call);               \
		if (st_) return fail((where), st_);    \
	} while (0)

char *memgen_ort_session_new(const char *path, int flags, int threads, OrtSession **out) {
	const OrtApi *api = memgen_ort_api();
	OrtEnv *env;
	TRY("CreateEnv", api->CreateEnv(ORT_LOGGING_LEVEL_ERROR, "memgen", &env));
	OrtSessionOptions *o;
	OrtStatus *st = api->CreateSessionOptions(&o);
	if (!st && (flags & MEMGEN_ORT_ENV_ALLOCATORS)) st = api->AddSessionConfigEntry(o, "session.use_env_allocators", "1");
	if (!st && threads > 0) st = api->SetIntraOpNumThreads(o, threads);
	if (!st && (flags & MEMGEN_ORT_NO_MEM_PATTERN)) st = api->DisableMemPattern(o);
	if (!st && (flags & MEMGEN_ORT_PARALLEL)) st = api->SetSessionExecutionMode(o, ORT_PARALLEL);
	if (!st && (flags & MEMGEN_ORT_PARALLEL)) st = api->SetInterOpNumThreads(o, 2);
	if (!st) st = api->CreateSession(env, path, o, out);
	if (o) api->ReleaseSessionOptions(o);
	api->ReleaseEnv(env);
	/* Loading parsed the model's protobuf (the weights' bytes included)
	 * into the C heap and freed it once the initializers were copied out:
	 * glibc keeps freed chunks of that size in its arenas (its mmap
	 * threshold rises with each large free), so without a trim the
	 * model's size stays resident, in nobody's account. */
	malloc_trim(0);
	return st ? fail("CreateSession", st) : NULL;
}

void memgen_ort_session_free(OrtSession *s) { memgen_ort_api()->ReleaseSession(s); }

char *memgen_ort_session_count(OrtSession *s, int outputs, size_t *n) {
	const OrtApi *api = memgen_ort_api();
	if (outputs) TRY("SessionGetOutputCount", api->SessionGetOutputCount(s, n));
	else TRY("SessionGetInputCount", api->SessionGetInputCount(s, n));
	return NULL;
}

char *memgen_ort_session_io(OrtSession *s, int outputs, size_t i, char **name, int *onnx_type, int *elem_type) {
	const OrtApi *api = memgen_ort_api();
	OrtAllocator *al;
	TRY("GetAllocatorWithDefaultOptions", api->GetAllocatorWithDefaultOptions(&al));
	char *n;
	if (outputs) TRY("SessionGetOutputName", api->SessionGetOutputName(s, i, al, &n));
	else TRY("SessionGetInputName", api->SessionGetInputName(s, i, al, &n));
	*name = strdup(n);
	OrtStatus *fs = api->AllocatorFree(al, n);
	if (fs) api->ReleaseStatus(fs);
	OrtTypeInfo *ti;
	if (outputs) TRY("SessionGetOutputTypeInfo", api->SessionGetOutputTypeInfo(s, i, &ti));
	else TRY("SessionGetInputTypeInfo", api->SessionGetInputTypeInfo(s, i, &ti));
	enum ONNXType t;
	OrtStatus *st = api->GetOnnxTypeFromTypeInfo(ti, &t);
	*onnx_type = (int)t;
	*elem_type = 0;
	if (!st && t == ONNX_TYPE_TENSOR) {
		const OrtTensorTypeAndShapeInfo *tsi;
		st = api->CastTypeInfoToTensorInfo(ti, &tsi);
		ONNXTensorElementDataType et = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
		if (!st && tsi) st = api->GetTensorElementType(tsi, &et);
		*elem_type = (int)et;
	}
	api->ReleaseTypeInfo(ti);
	return st ? fail("type info", st) : NULL;
}

char *memgen_ort_tensor_new(int elem_type, const int64_t *shape, size_t rank, const void *data, size_t nbytes,
                            char **strs, size_t nstrs, OrtValue **out) {
	const OrtApi *api = memgen_ort_api();
	OrtAllocator *al;
	TRY("GetAllocatorWithDefaultOptions", api->GetAllocatorWithDefaultOptions(&al));
	TRY("CreateTensorAsOrtValue",
	    api->CreateTensorAsOrtValue(al, shape, rank, (ONNXTensorElementDataType)elem_type, out));
	memgen_ort_count_value();
	OrtStatus *st = NULL;
	if (elem_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING) {
		if (nstrs) st = api->FillStringTensor(*out, (const char *const *)strs, nstrs);
	} else if (nbytes) {
		void *p;
		st = api->GetTensorMutableData(*out, &p);
		if (!st) memcpy(p, data, nbytes);
	}
	if (st) {
		api->ReleaseValue(*out);
		*out = NULL;
		return fail("fill tensor", st);
	}
	return NULL;
}

void memgen_ort_value_free(OrtValue *v) {
	if (v) memgen_ort_api()->ReleaseValue(v);
}

char *memgen_ort_run(OrtSession *s, OrtRunOptions *ro, const char **in_names, OrtValue **in, size_t nin,
                     const char **out_names, OrtValue **out, size_t nout) {
	TRY("Run", memgen_ort_api()->Run(s, ro, in_names, (const OrtValue *const *)in, nin, out_names, nout, out));
	return NULL;
}

char *memgen_ort_run_options_new(OrtRunOptions **out) {
	TRY("CreateRunOptions", memgen_ort_api()->CreateRunOptions(out));
	return NULL;
}

void memgen_ort_run_options_free(OrtRunOptions *ro) { memgen_ort_api()->ReleaseRunOptions(ro); }

char *memgen_ort_run_options_terminate(OrtRunOptions *ro, int on) {
	const OrtApi *api = memgen_ort_api();
	TRY("RunOptionsSetTerminate", on ? api->RunOptionsSetTerminate(ro) : api->RunOptionsUnsetTerminate(ro));
	return NULL;
}

char *memgen_ort_value_info(OrtValue *v, int *onnx_type, int *elem_type, int64_t *shape, size_t cap, size_t *rank,
                            size_t *count, void **data) {
	const OrtApi *api = memgen_ort_api();
	enum ONNXType t;
	TRY("GetValueType", api->GetValueType(v, &t));
	*onnx_type = (int)t;
	*rank = 0;
	*count = 0;
	*data = NULL;
	if (t != ONNX_TYPE_TENSOR) return NULL;
	OrtTensorTypeAndShapeInfo *info;
	TRY("GetTensorTypeAndShape", api->GetTensorTypeAndShape(v, &info));
	ONNXTensorElementDataType et;
	OrtStatus *st = api->GetTensorElementType(info, &et);
	if (!st) st = api->GetDimensionsCount(info, rank);
	if (!st && *rank > cap) {
		api->ReleaseTensorTypeAndShapeInfo(info);
		return strdup("value_info: rank above the caller's capacity");
	}
	if (!st && *rank) st = api->GetDimensions(info, shape, *rank);
	if (!st) st = api->GetTensorShapeElementCount(info, count);
	api->ReleaseTensorTypeAndShapeInfo(info);
	if (st) return fail("tensor info", st);
	*elem_type = (int)et;
	if (et != ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING && *count) TRY("GetTensorMutableData", api->GetTensorMutableData(v, data));
	return NULL;
}

char *memgen_ort_string_at(OrtValue *v, size_t i, char **s, size_t *len) {
	const OrtApi *api = memgen_ort_api();
	TRY("GetStringTensorElementLength", api->GetStringTensorElementLength(v, i, len));
	*s = malloc(*len + 1);
	if (!*s) return strdup("out of memory");
	OrtStatus *st = api->GetStringTensorElement(v, *len, i, *s);
	if (st) {
		free(*s);
		*s = NULL;
		return fail("GetStringTensorElement", st);
	}
	(*s)[*len] = 0;
	return NULL;
}

char *memgen_ort_default_allocator(OrtAllocator **out) {
	TRY("GetAllocatorWithDefaultOptions", memgen_ort_api()->GetAllocatorWithDefaultOptions(out));
	return NULL;
}
