package llamacpp

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBreakdownDeclarations holds breakdown.h's C++ declarations to the
// release's src/llama-ext.h: the C++ compiler cgo uses compiles both in one
// translation unit whose static assertions check that breakdown_data has
// llama_memory_breakdown_data's size and members' offsets, that the map's
// key is ggml_backend_buffer_type_t and that breakdown_fn is the type of
// llama_get_memory_breakdown; the object it makes refers to the function
// by the mangled name the shim looks up, and the library exports that
// name.
func TestBreakdownDeclarations(t *testing.T) {
	out, err := exec.Command("go", "env", "CXX").Output()
	cxx := strings.Fields(strings.TrimSpace(string(out)))
	if err != nil || len(cxx) == 0 {
		skipOrFail(t, "go env CXX: %v", err)
	}
	if _, err := exec.LookPath(cxx[0]); err != nil {
		skipOrFail(t, "no C++ compiler: %v", err)
	}
	if _, err := os.Stat(filepath.Join(srcDir, "src", "llama-ext.h")); err != nil {
		skipOrFail(t, "the release's source: %v", err)
	}
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "check.cpp")
	if err := os.WriteFile(src, []byte(`#include <cstddef>
#include <type_traits>
#include "llama-ext.h"
#include "breakdown.h"

static_assert(sizeof(memgen::breakdown_data) == sizeof(llama_memory_breakdown_data), "breakdown_data's size");
static_assert(offsetof(memgen::breakdown_data, model) == offsetof(llama_memory_breakdown_data, model), "model's offset");
static_assert(offsetof(memgen::breakdown_data, context) == offsetof(llama_memory_breakdown_data, context), "context's offset");
static_assert(offsetof(memgen::breakdown_data, compute) == offsetof(llama_memory_breakdown_data, compute), "compute's offset");
static_assert(std::is_same<decltype(llama_memory_breakdown_data::model), decltype(memgen::breakdown_data::model)>::value, "model's type");
static_assert(std::is_same<decltype(llama_memory_breakdown_data::context), decltype(memgen::breakdown_data::context)>::value, "context's type");
static_assert(std::is_same<decltype(llama_memory_breakdown_data::compute), decltype(memgen::breakdown_data::compute)>::value, "compute's type");
static_assert(std::is_same<ggml_backend_buffer_type_t, ggml_backend_buffer_type *>::value, "the map's key");
static_assert(std::is_same<llama_memory_breakdown::key_type, memgen::breakdown::key_type>::value, "the map's key type");
static_assert(std::is_same<decltype(&llama_get_memory_breakdown), llama_memory_breakdown (*)(const llama_context *)>::value, "the function's type");

void *memgen_check_ref() { return reinterpret_cast<void *>(&llama_get_memory_breakdown); }
`), 0o644); err != nil {
		t.Fatal(err)
	}
	obj := filepath.Join(dir, "check.o")
	args := append(cxx[1:], "-std=c++17", "-c", "-o", obj, "-I", here,
		"-I", filepath.Join(srcDir, "src"), "-I", filepath.Join(srcDir, "include"), "-I", filepath.Join(srcDir, "ggml", "include"), src)
	if out, err := exec.Command(cxx[0], args...).CombinedOutput(); err != nil {
		t.Fatalf("breakdown.h disagrees with llama-ext.h:\n%s", out)
	}
	const sym = "_Z26llama_get_memory_breakdownPK13llama_context"
	if !strings.Contains(string(readFileT(t, filepath.Join(here, "breakdown.h"))), `"`+sym+`"`) {
		t.Fatalf("breakdown.h no longer names %s", sym)
	}
	nm, err := exec.Command("nm", "-u", obj).CombinedOutput()
	if err != nil {
		skipOrFail(t, "nm: %v", err)
	}
	if !strings.Contains(string(nm), sym) {
		t.Errorf("the compiler refers to llama_get_memory_breakdown by another name than %s:\n%s", sym, nm)
	}
	dyn, err := exec.Command("nm", "-D", "--defined-only", libPath).CombinedOutput()
	if err != nil {
		skipOrFail(t, "nm -D: %v", err)
	}
	if !strings.Contains(string(dyn), sym) {
		t.Errorf("%s does not export %s", libPath, sym)
	}
}

func readFileT(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
