// The C half of the bridge; see bridge.h and allocator.go.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge.h"
#include "_cgo_export.h"

static void *lib;
static const OrtApi *api;
static OrtEnv *env;

static char *dup_msg(const char *prefix, const char *msg) {
	size_t n = strlen(prefix) + strlen(msg) + 3;
	char *s = malloc(n);
	if (s) snprintf(s, n, "%s: %s", prefix, msg);
	return s;
}

/* memgen_ort_status_msg is an ONNX Runtime failure: its OrtErrorCode, then the unit
 * separator (0x1f), then "prefix: message"; the Go side (cErr) makes it a
 * *SessionError. */
char *memgen_ort_status_msg(const char *prefix, OrtStatus *st) {
	const char *msg = api->GetErrorMessage(st);
	size_t n = strlen(prefix) + strlen(msg) + 16;
	char *s = malloc(n);
	if (s) snprintf(s, n, "%d\x1f%s: %s", (int)api->GetErrorCode(st), prefix, msg);
	api->ReleaseStatus(st);
	return s;
}

char *memgen_ort_load(const char *path) {
	if (api) return NULL;
	lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) return dup_msg("dlopen", dlerror());
	const OrtApiBase *(*get_base)(void) = (const OrtApiBase *(*)(void))dlsym(lib, "OrtGetApiBase");
	if (!get_base) {
		dlclose(lib);
		lib = NULL;
		return dup_msg("dlsym", "no OrtGetApiBase");
	}
	const OrtApi *a = get_base()->GetApi(ORT_API_VERSION);
	if (!a) {
		dlclose(lib);
		lib = NULL;
		return dup_msg("OrtGetApiBase", "the library does not serve the C API version of the headers");
	}
	api = a;
	// OrtEnv is a process singleton: this returns the environment
	// onnxruntime_go created, with one more reference.
	OrtStatus *st = api->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "memgen", &env);
	if (st) {
		char *s = memgen_ort_status_msg("CreateEnv", st);
		api = NULL;
		dlclose(lib);
		lib = NULL;
		return s;
	}
	return NULL;
}

void memgen_ort_unload(void) {
	if (!api) return;
	api->ReleaseEnv(env);
	env = NULL;
	api = NULL;
	dlclose(lib);
	lib = NULL;
}

const char *memgen_ort_version(void) {
	const OrtApiBase *(*get_base)(void) = (const OrtApiBase *(*)(void))dlsym(lib, "OrtGetApiBase");
	return get_base ? get_base()->GetVersionString() : "";
}

// memgen_ort_alloc_thunk and memgen_ort_reserve_thunk (alloc_thunk.cc)
// serve Alloc and Reserve.
extern void *memgen_ort_alloc_thunk(OrtAllocator *this_, size_t size);
extern void *memgen_ort_reserve_thunk(OrtAllocator *this_, size_t size);

// The keys of OrtAllocator::GetStats (onnxruntime_c_api.h, the BFC arena's
// AllocatorStats), in the order of the Go side's statsValues.
static const char *const stat_keys[MEMGEN_ORT_NSTATS] = {
	"Limit", "InUse", "TotalAllocated", "MaxInUse", "NumAllocs",
	"NumReserves", "NumArenaExtensions", "NumArenaShrinkages", "MaxAllocSize",
};

const char *memgen_ort_stat_key(int i) { return i >= 0 && i < MEMGEN_ORT_NSTATS ? stat_keys[i] : NULL; }

static OrtStatus *ORT_API_CALL bridge_get_stats(const OrtAllocator *this_, OrtKeyValuePairs **out) {
	int64_t v[MEMGEN_ORT_NSTATS];
	*out = NULL;
	if (!memgenOrtStats(((const memgen_ort_allocator *)this_)->id, v))
		return api->CreateStatus(ORT_FAIL, "memgen allocator: GetStats after Close");
	OrtKeyValuePairs *kv = NULL;
	api->CreateKeyValuePairs(&kv);
	if (!kv) return api->CreateStatus(ORT_FAIL, "memgen allocator: CreateKeyValuePairs failed");
	for (int i = 0; i < MEMGEN_ORT_NSTATS; i++) {
		char buf[32];
		snprintf(buf, sizeof buf, "%lld", (long long)v[i]);
		api->AddKeyValuePair(kv, stat_keys[i], buf);
	}
	*out = kv;
	return NULL;
}

// bridge_free serves Free: the front cache keeps a pool block when it has
// room, without Go; anything else Go frees, and the front counts the bytes
// Go reports freed. A block the front holds cached already is a double
// free, which Go reports.
static void ORT_API_CALL bridge_free(OrtAllocator *this_, void *p) {
	if (!p) return;
	memgen_ort_allocator *a = (memgen_ort_allocator *)this_;
	switch (memgen_ort_front_free(&a->front, p)) {
	case MEMGEN_ORT_FRONT_KEPT:
		return;
	case MEMGEN_ORT_FRONT_DOUBLE:
		memgenOrtDoubleFree(a->id, (uintptr_t)p);
		return;
	default:
		memgen_ort_front_freed(&a->front, memgenOrtFree(a->id, (uintptr_t)p));
	}
}

static const OrtMemoryInfo *ORT_API_CALL bridge_info(const OrtAllocator *this_) {
	return ((const memgen_ort_allocator *)this_)->info;
}

memgen_ort_allocator *memgen_ort_new_allocator(uintptr_t id, const uint64_t *classes, int nclass, int64_t front_bytes,
                                               int front_depth, char **err) {
	*err = NULL;
	if (!api) {
		*err = dup_msg("memgen_ort_new_allocator", "ONNX Runtime is not loaded");
		return NULL;
	}
	memgen_ort_allocator *a = calloc(1, sizeof *a);
	if (!a) {
		*err = dup_msg("memgen_ort_new_allocator", "out of memory");
		return NULL;
	}
	if (memgen_ort_front_init(&a->front, classes, nclass, front_bytes, front_depth) != 0) {
		*err = dup_msg("memgen_ort_new_allocator", "the front cache: bad class table or out of memory");
		free(a);
		return NULL;
	}
	// A device allocator (no arena): every Alloc and Free reaches Go.
	OrtStatus *st = api->CreateCpuMemoryInfo(OrtDeviceAllocator, OrtMemTypeDefault, &a->info);
	if (st) {
		*err = memgen_ort_status_msg("CreateCpuMemoryInfo", st);
		memgen_ort_front_release(&a->front);
		free(a);
		return NULL;
	}
	a->base.version = ORT_API_VERSION;
	a->base.Alloc = memgen_ort_alloc_thunk;
	a->base.Free = bridge_free;
	a->base.Info = bridge_info;
	a->base.Reserve = memgen_ort_reserve_thunk; // ORT_API_VERSION >= 18: a buffer of the binding, outside the pool
	a->base.GetStats = bridge_get_stats;       // >= 23: the pool's figures under the BFC arena's keys
	a->base.AllocOnStream = NULL;              // >= 23: optional; ONNX Runtime calls Alloc instead
	a->id = id;
	return a;
}

char *memgen_ort_register(memgen_ort_allocator *a) {
	OrtStatus *st = api->RegisterAllocator(env, &a->base);
	return st ? memgen_ort_status_msg("RegisterAllocator", st) : NULL;
}

char *memgen_ort_unregister(memgen_ort_allocator *a) {
	OrtStatus *st = api->UnregisterAllocator(env, a->info);
	return st ? memgen_ort_status_msg("UnregisterAllocator", st) : NULL;
}


void memgen_ort_free_call(memgen_ort_allocator *a, void *p) { a->base.Free(&a->base, p); }

OrtAllocator *memgen_ort_base(memgen_ort_allocator *a) { return &a->base; }

long memgen_ort_callback_loop(long n) {
	uintptr_t s = 0;
	for (long i = 0; i < 2 * n; i++) s += memgenOrtNoop((uintptr_t)i);
	return (long)(s & 1);
}

char *memgen_ort_get_stats(OrtAllocator *a, int via_api, int64_t *out, int *found) {
	OrtKeyValuePairs *kv = NULL;
	OrtStatus *st = via_api ? api->AllocatorGetStats(a, &kv) : a->GetStats(a, &kv);
	if (st) return memgen_ort_status_msg(via_api ? "AllocatorGetStats" : "OrtAllocator::GetStats", st);
	for (int i = 0; i < MEMGEN_ORT_NSTATS; i++) {
		const char *v = kv ? api->GetKeyValue(kv, stat_keys[i]) : NULL;
		found[i] = v != NULL;
		out[i] = v ? strtoll(v, NULL, 10) : 0;
	}
	if (kv) api->ReleaseKeyValuePairs(kv);
	return NULL;
}

char *memgen_ort_session_allocator(OrtSession *s, OrtAllocator **out) {
	OrtMemoryInfo *info;
	OrtStatus *st = api->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &info);
	if (st) return memgen_ort_status_msg("CreateCpuMemoryInfo", st);
	st = api->CreateAllocator(s, info, out);
	api->ReleaseMemoryInfo(info);
	return st ? memgen_ort_status_msg("CreateAllocator", st) : NULL;
}

void memgen_ort_release_allocator(OrtAllocator *a) { api->ReleaseAllocator(a); }

const OrtApi *memgen_ort_api(void) { return api; }
