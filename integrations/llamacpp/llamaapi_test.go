package llamacpp

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memgen/memgen/internal/cdecl"
)

// llamaapi.h is memgen's own declaration of the part of llama.cpp's C API
// and ggml's backend interface the bridge uses. These tests hold it to the
// release's own headers (llama.h, ggml-backend-impl.h, from the source
// scripts/llamacpp.sh clones into the cache): both are compiled by the C
// compiler cgo uses, with debug information for every type they declare,
// and the types are compared as the compiler laid them out (debug/dwarf),
// name by name:
//
//   - every struct llamaapi.h defines: its size, and each member's name,
//     offset and type, in order;
//   - every enum it declares: its size, and each of its constants exists
//     upstream with the same value (it declares only the ones it uses);
//   - every ggml/llama typedef it declares: the same type upstream;
//   - GGML_BACKEND_API_VERSION.
//
// Types are compared structurally with typedefs resolved, qualifiers kept,
// and structs and enums by tag.

func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if required() {
		t.Fatalf("%s; CI=true or MEMGEN_LLAMACPP_REQUIRE=1 requires this check to run", msg)
	}
	t.Skip(msg)
}

// compiler is the C compiler cgo uses (go env CC).
func compiler(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "CC").Output()
	cc := strings.Fields(strings.TrimSpace(string(out)))
	if err != nil || len(cc) == 0 {
		skipOrFail(t, "go env CC: %v", err)
	}
	if _, err := exec.LookPath(cc[0]); err != nil {
		skipOrFail(t, "no C compiler: %v", err)
	}
	return cc[0]
}

// declared is what one translation unit declares, as the compiler saw it.
type declared = cdecl.Decls

const macroEnum = "memgen_check_macros"

// compileTU compiles src (with the include directories) and returns the
// types it declares.
func compileTU(t *testing.T, cc, src string, incs ...string) *declared {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "tu.c")
	obj := filepath.Join(dir, "tu.o")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-std=c11", "-g", "-fno-eliminate-unused-debug-types", "-c", file, "-o", obj}
	for _, i := range incs {
		args = append(args, "-I", i)
	}
	cmd := exec.Command(cc, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	decl, err := cdecl.Read(obj)
	if err != nil {
		t.Fatal(err)
	}
	return decl
}

// ours names the types llamaapi.h declares for llama.cpp and ggml.
func ours(name string) bool {
	for _, p := range []string{"ggml_", "llama_", "GGML", "LLAMA"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return name == macroEnum
}

// compareDecls lists every way ours differs from upstream's.
func compareDecls(our, up *declared) []string {
	var diffs []string
	bad := func(format string, args ...any) { diffs = append(diffs, fmt.Sprintf(format, args...)) }
	for _, name := range []string{"ggml_backend_buffer_i", "ggml_backend_buffer_type_i", "ggml_backend_device_i", "ggml_backend_reg",
		"ggml_backend_buffer", "ggml_tensor", "llama_model_params", "llama_context_params", "llama_batch"} {
		if s := our.Structs[name]; s == nil || s.Incomplete {
			bad("struct %s: not defined by llamaapi.h", name)
		}
	}
	if our.Enums[macroEnum] == nil || up.Enums[macroEnum] == nil {
		bad("GGML_BACKEND_API_VERSION: not seen in the debug information")
	}
	for _, name := range cdecl.SortedKeys(our.Structs) {
		s := our.Structs[name]
		if !ours(name) {
			continue
		}
		u := up.Structs[name]
		switch {
		case u == nil:
			bad("struct %s: not declared upstream", name)
			continue
		case s.Incomplete:
			continue
		case u.Incomplete:
			bad("struct %s: defined here, opaque upstream", name)
			continue
		}
		if s.ByteSize != u.ByteSize {
			bad("struct %s: %d bytes here, %d upstream", name, s.ByteSize, u.ByteSize)
		}
		if len(s.Field) != len(u.Field) {
			bad("struct %s: %d members here, %d upstream", name, len(s.Field), len(u.Field))
		}
		for i, f := range s.Field {
			if i >= len(u.Field) {
				break
			}
			uf := u.Field[i]
			if f.Name != uf.Name {
				bad("struct %s: member %d is %s here, %s upstream", name, i, f.Name, uf.Name)
				continue
			}
			if f.ByteOffset != uf.ByteOffset {
				bad("%s.%s: offset %d here, %d upstream", name, f.Name, f.ByteOffset, uf.ByteOffset)
			}
			if a, b := cdecl.Canon(f.Type), cdecl.Canon(uf.Type); a != b {
				bad("%s.%s: type\n\t%s here,\n\t%s upstream", name, f.Name, a, b)
			}
		}
	}
	for _, name := range cdecl.SortedKeys(our.Enums) {
		if !ours(name) {
			continue
		}
		e, u := our.Enums[name], up.Enums[name]
		if u == nil {
			bad("enum %s: not declared upstream", name)
			continue
		}
		if e.ByteSize != u.ByteSize {
			bad("enum %s: %d bytes here, %d upstream", name, e.ByteSize, u.ByteSize)
		}
		upVal := map[string]int64{}
		for _, v := range u.Val {
			upVal[v.Name] = v.Val
		}
		for _, v := range e.Val {
			if w, ok := upVal[v.Name]; !ok {
				bad("enum %s: %s is not an upstream constant", name, v.Name)
			} else if v.Val != w {
				bad("enum %s: %s = %d here, %d upstream", name, v.Name, v.Val, w)
			}
		}
	}
	for _, name := range cdecl.SortedKeys(our.Typedefs) {
		if !ours(name) {
			continue
		}
		u := up.Typedefs[name]
		if u == nil {
			bad("typedef %s: not declared upstream", name)
		} else if a, b := cdecl.Canon(our.Typedefs[name].Type), cdecl.Canon(u.Type); a != b {
			bad("typedef %s: %s here, %s upstream", name, a, b)
		}
	}
	return diffs
}

// upstreamDecls compiles the release's ggml-backend-impl.h and llama.h.
func upstreamDecls(t *testing.T, cc string) *declared {
	t.Helper()
	impl := filepath.Join(srcDir, "ggml", "src", "ggml-backend-impl.h")
	if _, err := os.Stat(impl); err != nil {
		skipOrFail(t, "no llama.cpp source at %s (run `make llamacpp`): %v", srcDir, err)
	}
	src := "#include \"ggml-backend-impl.h\"\n#include \"llama.h\"\n" +
		"enum " + macroEnum + " { memgen_check_GGML_BACKEND_API_VERSION = GGML_BACKEND_API_VERSION };\n"
	return compileTU(t, cc, src, filepath.Join(srcDir, "ggml", "include"), filepath.Join(srcDir, "ggml", "src"), filepath.Join(srcDir, "include"))
}

func ourDecls(t *testing.T, cc, header string) *declared {
	t.Helper()
	src := fmt.Sprintf("#include %q\nenum %s { memgen_check_GGML_BACKEND_API_VERSION = MEMGEN_GGML_BACKEND_API_VERSION };\n", header, macroEnum)
	return compileTU(t, cc, src)
}

func ourHeader(t *testing.T) string {
	t.Helper()
	h, err := filepath.Abs("llamaapi.h")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestLlamaAPIMatchesUpstream: llamaapi.h declares what the release's
// headers declare, at the same offsets, with the same types and values.
func TestLlamaAPIMatchesUpstream(t *testing.T) {
	cc := compiler(t)
	diffs := compareDecls(ourDecls(t, cc, ourHeader(t)), upstreamDecls(t, cc))
	for _, d := range diffs {
		t.Error("llamaapi.h: " + d)
	}
}

// TestLlamaAPICompilesCleanly: llamaapi.h alone compiles as C11 and C++17
// without a warning.
func TestLlamaAPICompilesCleanly(t *testing.T) {
	h := ourHeader(t)
	src := filepath.Join(t.TempDir(), "alone.c")
	if err := os.WriteFile(src, []byte(fmt.Sprintf("#include %q\n", h)), 0o644); err != nil {
		t.Fatal(err)
	}
	cc := compiler(t)
	for _, c := range []struct{ lang, std string }{{"c", "-std=c11"}, {"c++", "-std=c++17"}} {
		cmd := exec.Command(cc, "-x", c.lang, c.std, "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-fsyntax-only", src)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", cmd, err, out)
		}
	}
}

// TestLlamaAPICheckCatchesMismatches breaks llamaapi.h in one place at a
// time and requires the comparison to name what broke.
func TestLlamaAPICheckCatchesMismatches(t *testing.T) {
	cc := compiler(t)
	up := upstreamDecls(t, cc)
	orig, err := os.ReadFile(ourHeader(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct{ name, from, to, want string }{
		{"a buffer slot dropped", "\tvoid (*reset)(ggml_backend_buffer_t buffer);\n", "", "struct ggml_backend_buffer_i: 80 bytes here, 88 upstream"},
		{"two buffer slots swapped", "\tvoid (*clear)(ggml_backend_buffer_t buffer, uint8_t value);\n\tvoid (*reset)(ggml_backend_buffer_t buffer);",
			"\tvoid (*reset)(ggml_backend_buffer_t buffer);\n\tvoid (*clear)(ggml_backend_buffer_t buffer, uint8_t value);", "member 9 is reset here, clear upstream"},
		{"a parameter's type", "size_t (*get_alignment)(ggml_backend_buffer_type_t buft);", "int (*get_alignment)(ggml_backend_buffer_type_t buft);", "ggml_backend_buffer_type_i.get_alignment: type"},
		{"a device slot's qualifier", "bool (*supports_op)(ggml_backend_dev_t dev, const struct ggml_tensor *op);", "bool (*supports_op)(ggml_backend_dev_t dev, struct ggml_tensor *op);", "ggml_backend_device_i.supports_op: type"},
		{"the tensor's name length", "char name[64];", "char name[48];", "ggml_tensor.name: type"},
		{"a context parameter moved", "\tbool kv_unified;\n", "", "struct llama_context_params"},
		{"a model parameter's type", "int32_t n_gpu_layers;", "int64_t n_gpu_layers;", "llama_model_params.n_gpu_layers: type"},
		{"an enum value", "LLAMA_FLASH_ATTN_TYPE_ENABLED = 1", "LLAMA_FLASH_ATTN_TYPE_ENABLED = 2", "LLAMA_FLASH_ATTN_TYPE_ENABLED = 2 here, 1 upstream"},
		{"an invented constant", "GGML_OP_NONE = 0,", "GGML_OP_NONE = 0, GGML_OP_MEMGEN = 1000,", "GGML_OP_MEMGEN is not an upstream constant"},
		{"the API version", "#define MEMGEN_GGML_BACKEND_API_VERSION 2", "#define MEMGEN_GGML_BACKEND_API_VERSION 3", "memgen_check_GGML_BACKEND_API_VERSION = 3 here, 2 upstream"},
		{"a handle's type", "typedef struct ggml_backend_device *ggml_backend_dev_t;", "typedef struct ggml_backend_reg *ggml_backend_dev_t;", "typedef ggml_backend_dev_t"},
	} {
		t.Run(m.name, func(t *testing.T) {
			if !strings.Contains(string(orig), m.from) {
				t.Fatalf("llamaapi.h no longer contains %q: update the mutation", m.from)
			}
			h := filepath.Join(t.TempDir(), "llamaapi.h")
			if err := os.WriteFile(h, []byte(strings.Replace(string(orig), m.from, m.to, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			diffs := compareDecls(ourDecls(t, cc, h), up)
			for _, d := range diffs {
				if strings.Contains(d, m.want) {
					return
				}
			}
			t.Errorf("no difference mentions %q; got:\n%s", m.want, strings.Join(diffs, "\n"))
		})
	}
}
