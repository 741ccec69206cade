package ort

import (
	"debug/dwarf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/memgen/memgen/internal/cdecl"
)

// ortapi.h is memgen's own declaration of the part of ONNX Runtime's C API
// the bridge uses. These tests hold it to the onnxruntime_c_api.h of the
// github.com/yalue/onnxruntime_go version in go.mod (the module's root
// holds it): both headers are compiled by the C compiler cgo uses, with
// debug information for every type they declare, and the types are compared
// as the compiler laid them out (debug/dwarf), name by name:
//
//   - every struct ortapi.h defines: each member's offset and type, and for
//     a struct without skipped slots (OrtAllocator, OrtApiBase) the whole
//     layout and size; OrtApi's MEMGEN_ORT_SKIP ranges sit where they say;
//   - every opaque struct and every Ort/ONNX typedef ortapi.h declares
//     exists upstream, as the same type;
//   - every enum ortapi.h declares: its size and the same constants with the
//     same values, no more, no fewer;
//   - ORT_API_VERSION.
//
// Types are compared structurally with typedefs resolved (OrtStatusPtr is
// OrtStatus *), qualifiers kept, and structs and enums by tag. Attributes
// that are not part of a type (warn_unused_result, nonnull) are not
// compared.

const upstreamModule = "github.com/yalue/onnxruntime_go"

// ortRequired says whether a missing prerequisite fails rather than skips,
// as in TestMain.
func ortRequired() bool {
	return os.Getenv("MEMGEN_ORT_REQUIRE") == "1" || os.Getenv("CI") == "true"
}

func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if ortRequired() {
		t.Fatalf("%s; CI=true or MEMGEN_ORT_REQUIRE=1 requires this check to run", msg)
	}
	t.Skip(msg)
}

// goCmd runs `go args...` in the package's directory (the module root).
func goCmd(args ...string) ([]byte, error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	cmd := exec.Command(gobin, args...)
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		err = fmt.Errorf("%v: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return out, err
}

// upstreamHeader is the path of onnxruntime_c_api.h in the module cache.
func upstreamHeader(t *testing.T) string {
	t.Helper()
	out, err := goCmd("list", "-m", "-f", "{{.Dir}}", upstreamModule)
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		skipOrFail(t, "cannot find %s in the module cache (go list -m: %v)", upstreamModule, err)
	}
	h := filepath.Join(dir, "onnxruntime_c_api.h")
	if _, err := os.Stat(h); err != nil {
		skipOrFail(t, "%s has no onnxruntime_c_api.h: %v", upstreamModule, err)
	}
	return h
}

// compiler is the C compiler cgo uses (go env CC).
func compiler(t *testing.T, name string) string {
	t.Helper()
	out, err := goCmd("env", name)
	cc := strings.Fields(strings.TrimSpace(string(out)))
	if err != nil || len(cc) == 0 {
		skipOrFail(t, "go env %s: %v", name, err)
	}
	if _, err := exec.LookPath(cc[0]); err != nil {
		skipOrFail(t, "no C compiler: %v", err)
	}
	return cc[0]
}

// declared is what one translation unit declares, as the compiler saw it.
type declared = cdecl.Decls

// macroEnum carries the header's macros into the debug information.
const macroEnum = "memgen_check_macros"

// compileHeader compiles a translation unit that includes header and
// returns the types it declares.
func compileHeader(t *testing.T, cc, header string) *declared {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "tu.c")
	obj := filepath.Join(dir, "tu.o")
	tu := fmt.Sprintf("#include %q\nenum %s { memgen_check_ORT_API_VERSION = ORT_API_VERSION };\n", header, macroEnum)
	if err := os.WriteFile(src, []byte(tu), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(cc, "-std=c11", "-g", "-fno-eliminate-unused-debug-types", "-c", src, "-o", obj)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	decl, err := cdecl.Read(obj)
	if err != nil {
		t.Fatal(err)
	}
	return decl
}

// ours names the types ortapi.h declares for ONNX Runtime.
func ours(name string) bool {
	return strings.HasPrefix(name, "Ort") || strings.HasPrefix(name, "ONNX") || name == macroEnum
}

// skipped parses a MEMGEN_ORT_SKIP member's name: the first and last slot
// it stands for.
func skipped(name string) (first, last int, ok bool) {
	rest, found := strings.CutPrefix(name, "memgen_skip_")
	if !found {
		return 0, 0, false
	}
	a, b, found := strings.Cut(rest, "_")
	first, err1 := strconv.Atoi(a)
	last, err2 := strconv.Atoi(b)
	return first, last, found && err1 == nil && err2 == nil
}

// compareHeaders lists every way ours differs from upstream's.
func compareHeaders(our, up *declared) []string {
	var diffs []string
	bad := func(format string, args ...any) { diffs = append(diffs, fmt.Sprintf(format, args...)) }

	for _, name := range []string{"OrtApi", "OrtApiBase", "OrtAllocator"} {
		if s := our.Structs[name]; s == nil || s.Incomplete {
			bad("struct %s: not defined by ortapi.h", name)
		}
	}
	if our.Enums[macroEnum] == nil || up.Enums[macroEnum] == nil {
		bad("ORT_API_VERSION: not seen in the debug information")
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
			continue // opaque here: upstream may define it or not
		case u.Incomplete:
			bad("struct %s: defined here, opaque upstream", name)
			continue
		}
		ptr := int64(8)
		if p, ok := our.Typedefs["uintptr_t"]; ok {
			ptr = p.Size()
		}
		upField := map[string]*dwarf.StructField{}
		for _, f := range u.Field {
			upField[f.Name] = f
		}
		partial := false
		for _, f := range s.Field {
			if first, last, ok := skipped(f.Name); ok {
				partial = true
				want := fmt.Sprintf("[%d]*void", last-first+1)
				if f.ByteOffset != int64(first)*ptr || cdecl.Canon(f.Type) != want {
					bad("%s.%s: at offset %d as %s, want offset %d as %s", name, f.Name, f.ByteOffset, cdecl.Canon(f.Type), int64(first)*ptr, want)
				}
				continue
			}
			uf := upField[f.Name]
			if uf == nil {
				bad("%s.%s: no such member upstream", name, f.Name)
				continue
			}
			if f.ByteOffset != uf.ByteOffset {
				bad("%s.%s: offset %d (slot %d) here, %d (slot %d) upstream", name, f.Name, f.ByteOffset, f.ByteOffset/ptr, uf.ByteOffset, uf.ByteOffset/ptr)
			}
			if a, b := cdecl.Canon(f.Type), cdecl.Canon(uf.Type); a != b {
				bad("%s.%s: type\n\t%s here,\n\t%s upstream", name, f.Name, a, b)
			}
		}
		if partial {
			if s.ByteSize > u.ByteSize {
				bad("struct %s: %d bytes here, more than upstream's %d", name, s.ByteSize, u.ByteSize)
			}
			continue
		}
		// A struct without skipped slots is the whole struct.
		if s.ByteSize != u.ByteSize {
			bad("struct %s: %d bytes here, %d upstream", name, s.ByteSize, u.ByteSize)
		}
		if len(s.Field) != len(u.Field) {
			var names []string
			for _, f := range u.Field {
				names = append(names, f.Name)
			}
			bad("struct %s: %d members here, %d upstream (%s)", name, len(s.Field), len(u.Field), strings.Join(names, ", "))
		} else {
			for i, f := range s.Field {
				if f.Name != u.Field[i].Name {
					bad("struct %s: member %d is %s here, %s upstream", name, i, f.Name, u.Field[i].Name)
				}
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
		seen := map[string]bool{}
		for _, v := range e.Val {
			seen[v.Name] = true
			if w, ok := upVal[v.Name]; !ok {
				bad("enum %s: %s is not an upstream constant", name, v.Name)
			} else if v.Val != w {
				bad("enum %s: %s = %d here, %d upstream", name, v.Name, v.Val, w)
			}
		}
		for _, v := range u.Val {
			if !seen[v.Name] {
				bad("enum %s: upstream's %s = %d is missing here", name, v.Name, v.Val)
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

func ourHeader(t *testing.T) string {
	t.Helper()
	h, err := filepath.Abs("ortapi.h")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestOrtAPIMatchesUpstream: ortapi.h declares what ONNX Runtime's header
// declares, at the same offsets, with the same types and values.
func TestOrtAPIMatchesUpstream(t *testing.T) {
	up := upstreamHeader(t)
	cc := compiler(t, "CC")
	diffs := compareHeaders(compileHeader(t, cc, ourHeader(t)), compileHeader(t, cc, up))
	for _, d := range diffs {
		t.Error("ortapi.h: " + d)
	}
	if len(diffs) > 0 {
		t.Logf("compared with %s", up)
	}
}

// TestOrtAPICompilesCleanly: ortapi.h alone compiles as C11 and C++17
// without a warning (the bridge is both).
func TestOrtAPICompilesCleanly(t *testing.T) {
	h := ourHeader(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "alone.c")
	if err := os.WriteFile(src, []byte(fmt.Sprintf("#include %q\n", h)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ tool, lang, std string }{{"CC", "c", "-std=c11"}, {"CXX", "c++", "-std=c++17"}} {
		cmd := exec.Command(compiler(t, c.tool), "-x", c.lang, c.std, "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-fsyntax-only", src)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", cmd, err, out)
		}
	}
}

// TestOrtAPICheckCatchesMismatches breaks ortapi.h in one place at a time
// and requires the comparison to name what broke: the check above can
// fail.
func TestOrtAPICheckCatchesMismatches(t *testing.T) {
	up := upstreamHeader(t)
	cc := compiler(t, "CC")
	upDecl := compileHeader(t, cc, up)
	orig, err := os.ReadFile(ourHeader(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		name, from, to, want string
	}{
		{"a slot moved", "MEMGEN_ORT_SKIP(4, 6);", "MEMGEN_ORT_SKIP(4, 5);", "OrtApi.CreateSession: offset"},
		{"a skip range too long", "MEMGEN_ORT_SKIP(8, 8);", "MEMGEN_ORT_SKIP(8, 9);", "OrtApi.Run: offset 80 (slot 10) here, 72 (slot 9) upstream"},
		{"a hand-written skip of the wrong length", "MEMGEN_ORT_SKIP(8, 8);", "void *memgen_skip_8_8[2];", "OrtApi.memgen_skip_8_8: at offset 64 as [2]*void, want offset 64 as [1]*void"},
		{"a parameter's type", "const int64_t *shape, size_t rank", "const int64_t *shape, unsigned rank", "OrtApi.CreateTensorAsOrtValue: type"},
		{"a parameter's qualifier", "(OrtLoggingLevel level, const char *logid", "(OrtLoggingLevel level, char *logid", "OrtApi.CreateEnv: type"},
		{"a return type", "void (*ReleaseKeyValuePairs)", "int (*ReleaseKeyValuePairs)", "OrtApi.ReleaseKeyValuePairs: type"},
		{"a parameter dropped", "(const OrtKeyValuePairs *kv, const char *key); // NULL", "(const OrtKeyValuePairs *kv); // NULL", "OrtApi.GetKeyValue: type"},
		{"an enum value", "ORT_LOGGING_LEVEL_WARNING = 2", "ORT_LOGGING_LEVEL_WARNING = 3", "ORT_LOGGING_LEVEL_WARNING = 3 here, 2 upstream"},
		{"an enum constant missing", "\tOrtReadOnlyAllocator = 2,\n", "", "upstream's OrtReadOnlyAllocator = 2 is missing"},
		{"an allocator slot missing", "\tvoid *(ORT_API_CALL *AllocOnStream)(struct OrtAllocator *self, size_t size, OrtSyncStream *stream);\n", "", "struct OrtAllocator: 48 bytes here, 56 upstream"},
		{"an allocator slot's parameters", "void *(ORT_API_CALL *Reserve)(struct OrtAllocator *self, size_t size);", "void *(ORT_API_CALL *Reserve)(struct OrtAllocator *self, size_t size, OrtSyncStream *stream);", "OrtAllocator.Reserve: type"},
		{"an allocator slot's type", "const OrtMemoryInfo *(ORT_API_CALL *Info)(const struct OrtAllocator *self)", "OrtMemoryInfo *(ORT_API_CALL *Info)(const struct OrtAllocator *self)", "OrtAllocator.Info: type"},
		{"OrtApiBase", "(ORT_API_CALL *GetApi)(uint32_t version)", "(ORT_API_CALL *GetApi)(uint64_t version)", "OrtApiBase.GetApi: type"},
		{"ORT_API_VERSION", "#define ORT_API_VERSION 24", "#define ORT_API_VERSION 23", "memgen_check_ORT_API_VERSION = 23 here, 24 upstream"},
		{"a handle's type", "typedef struct OrtValue OrtValue;", "typedef struct OrtValueX OrtValue;", "typedef OrtValue"},
	} {
		t.Run(m.name, func(t *testing.T) {
			if !strings.Contains(string(orig), m.from) {
				t.Fatalf("ortapi.h no longer contains %q: update the mutation", m.from)
			}
			h := filepath.Join(t.TempDir(), "ortapi.h")
			if err := os.WriteFile(h, []byte(strings.Replace(string(orig), m.from, m.to, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			diffs := compareHeaders(compileHeader(t, cc, h), upDecl)
			for _, d := range diffs {
				if strings.Contains(d, m.want) {
					return
				}
			}
			t.Errorf("no difference mentions %q; got:\n%s", m.want, strings.Join(diffs, "\n"))
		})
	}
}
