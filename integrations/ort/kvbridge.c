// Tensors over memory the caller owns, for the decoder's KV cache
// (decoder.go, sequence.go); see bridge.h.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge.h"

extern const OrtApi *memgen_ort_api(void);

static char *kv_fail(const char *where, OrtStatus *st) { return memgen_ort_status_msg(where, st); }

static long values_made;

long memgen_ort_values_made(void) { return __atomic_load_n(&values_made, __ATOMIC_SEQ_CST); }

void memgen_ort_count_value(void) { __atomic_add_fetch(&values_made, 1, __ATOMIC_SEQ_CST); }

char *memgen_ort_value_over(uintptr_t data, size_t nbytes, const int64_t *shape, size_t rank, int elem_type,
                            OrtValue **out) {
	const OrtApi *api = memgen_ort_api();
	OrtMemoryInfo *info;
	OrtStatus *st = api->CreateCpuMemoryInfo(OrtDeviceAllocator, OrtMemTypeDefault, &info);
	if (st) return kv_fail("CreateCpuMemoryInfo", st);
	st = api->CreateTensorWithDataAsOrtValue(info, (void *)data, nbytes, shape, rank, (ONNXTensorElementDataType)elem_type,
	                                         out);
	api->ReleaseMemoryInfo(info);
	if (st) return kv_fail("CreateTensorWithDataAsOrtValue", st);
	memgen_ort_count_value();
	return NULL;
}

char *memgen_ort_value_data(OrtValue *v, void **data) {
	OrtStatus *st = memgen_ort_api()->GetTensorMutableData(v, data);
	return st ? kv_fail("GetTensorMutableData", st) : NULL;
}

char *memgen_ort_session_dims(OrtSession *s, int outputs, size_t i, int64_t *dims, size_t cap, size_t *rank) {
	const OrtApi *api = memgen_ort_api();
	OrtTypeInfo *ti;
	OrtStatus *st = outputs ? api->SessionGetOutputTypeInfo(s, i, &ti) : api->SessionGetInputTypeInfo(s, i, &ti);
	if (st) return kv_fail("type info", st);
	const OrtTensorTypeAndShapeInfo *tsi = NULL;
	st = api->CastTypeInfoToTensorInfo(ti, &tsi);
	*rank = 0;
	if (!st && tsi) st = api->GetDimensionsCount(tsi, rank);
	if (!st && *rank > cap) {
		api->ReleaseTypeInfo(ti);
		return strdup("session_dims: rank above the caller's capacity");
	}
	if (!st && tsi && *rank) st = api->GetDimensions(tsi, dims, *rank);
	api->ReleaseTypeInfo(ti);
	return st ? kv_fail("dimensions", st) : NULL;
}

void memgen_ort_zero(uintptr_t p, size_t n) { memset((void *)p, 0, n); }
