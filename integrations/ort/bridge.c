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

static char *status_msg(const char *prefix, OrtStatus *st) {
	char *s = dup_msg(prefix, api->GetErrorMessage(st));
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
		char *s = status_msg("CreateEnv", st);
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

// memgen_ort_alloc_thunk (alloc_thunk.cc) serves Alloc and Reserve.
extern void *memgen_ort_alloc_thunk(OrtAllocator *this_, size_t size);

static void ORT_API_CALL bridge_free(OrtAllocator *this_, void *p) {
	if (p) memgenOrtFree(((memgen_ort_allocator *)this_)->id, (uintptr_t)p);
}

static const OrtMemoryInfo *ORT_API_CALL bridge_info(const OrtAllocator *this_) {
	return ((const memgen_ort_allocator *)this_)->info;
}

memgen_ort_allocator *memgen_ort_new_allocator(uintptr_t id, char **err) {
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
	// A device allocator (no arena): every Alloc and Free reaches Go.
	OrtStatus *st = api->CreateCpuMemoryInfo(OrtDeviceAllocator, OrtMemTypeDefault, &a->info);
	if (st) {
		*err = status_msg("CreateCpuMemoryInfo", st);
		free(a);
		return NULL;
	}
	a->base.version = ORT_API_VERSION;
	a->base.Alloc = memgen_ort_alloc_thunk;
	a->base.Free = bridge_free;
	a->base.Info = bridge_info;
	a->base.Reserve = memgen_ort_alloc_thunk; // reserved memory is allocated memory here
	a->id = id;
	return a;
}

char *memgen_ort_register(memgen_ort_allocator *a) {
	OrtStatus *st = api->RegisterAllocator(env, &a->base);
	return st ? status_msg("RegisterAllocator", st) : NULL;
}

char *memgen_ort_unregister(memgen_ort_allocator *a) {
	OrtStatus *st = api->UnregisterAllocator(env, a->info);
	return st ? status_msg("UnregisterAllocator", st) : NULL;
}


void memgen_ort_free_call(memgen_ort_allocator *a, void *p) { a->base.Free(&a->base, p); }

const OrtApi *memgen_ort_api(void) { return api; }
