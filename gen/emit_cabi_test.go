package gen

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// cabiCase is the golden case of the C ABI emitter: the tiny spec with a
// plugin_abi block (another major, two minors, its own prefix and paths).
const cabiCase = "testdata/cabi"

func cabiSpec(t *testing.T, block string) (*Spec, error) {
	t.Helper()
	base, err := os.ReadFile("testdata/valid_tiny/spec.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return Load(specName, append(base, block...))
}

// TestCABIGolden compares the header and the loader's files generated for
// the case with testdata/cabi/want (go test ./gen -update rewrites them).
// Only the emitter's own outputs are compared, so other emitters' changes do
// not touch this case.
func TestCABIGolden(t *testing.T) {
	block, err := os.ReadFile(filepath.Join(cabiCase, "plugin_abi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := cabiSpec(t, string(block))
	if err != nil {
		t.Fatal(err)
	}
	files, err := Generate(s, Config{Module: goldenModule})
	if err != nil {
		t.Fatal(err)
	}
	ours := map[string][]byte{}
	for rel, data := range files {
		if rel == s.PluginABI.Header || strings.HasPrefix(rel, s.PluginABI.Loader+"/") {
			ours[rel] = data
		}
	}
	if len(ours) != 3 {
		t.Fatalf("the C ABI emitter wrote %d files, want the header and two loader files", len(ours))
	}
	exp := filepath.Join(cabiCase, "want") // not "expected": FuzzGenerate seeds from */expected
	if *update {
		must(t, os.RemoveAll(exp))
		for rel, data := range ours {
			p := filepath.Join(exp, filepath.FromSlash(rel))
			must(t, os.MkdirAll(filepath.Dir(p), 0o755))
			must(t, os.WriteFile(p, data, 0o644))
		}
		return
	}
	for rel, data := range ours {
		want, err := os.ReadFile(filepath.Join(exp, filepath.FromSlash(rel)))
		switch {
		case err != nil:
			t.Errorf("%s: %v (go test ./gen -update)", rel, err)
		case !bytes.Equal(data, want):
			t.Errorf("%s: differs from the golden file: %s", rel, firstDiff(data, want))
		}
	}
	h := string(ours[s.PluginABI.Header])
	for _, want := range []string{
		"#define TINY_ABI_MAJOR 3u", "#define TINY_ABI_MINOR 2u", `#define TINY_PLUGIN_ENTRY "tiny_plugin_v3"`,
		"Since ABI 3.1.", "Since ABI 3.2.", "const void *reserved[2];", "TINY_ERR_OUT_OF_MEMORY = 3,",
		"Limits and statuses: req->size is at least 1.", "(*allocate)(void *instance, uint64_t deadline_ns,", "(*open)(const char *config, tiny_open_out *out)",
	} {
		if !strings.Contains(h, want) {
			t.Errorf("header lacks %q", want)
		}
	}
	// A minor's slots come after the older ones: used_bytes (minor 2) last.
	if i, j := strings.Index(h, "(*free)"), strings.Index(h, "(*used_bytes)"); i < 0 || j < i {
		t.Errorf("used_bytes (added by minor 2) is not after free in the header")
	}
}

// TestNoCABIWithoutBlock: a spec without plugin_abi generates nothing of it.
func TestNoCABIWithoutBlock(t *testing.T) {
	s, err := cabiSpec(t, "")
	if err != nil {
		t.Fatal(err)
	}
	files, err := Generate(s, Config{Module: goldenModule})
	if err != nil {
		t.Fatal(err)
	}
	for rel := range files {
		if strings.HasSuffix(rel, ".h") || strings.Contains(rel, "zz_generated.abi") {
			t.Errorf("%s generated without a plugin_abi block", rel)
		}
	}
}

// TestCABIErrors: mistakes in the plugin_abi block are reported with their
// positions, all at once.
func TestCABIErrors(t *testing.T) {
	for _, c := range []struct{ name, block, want string }{
		{"missing-keys", "plugin_abi:\n  major: 1\n", `plugin_abi: missing "minor"`},
		{"unknown-key", "plugin_abi:\n  major: 1\n  minor: 0\n  header: a.h\n  loader: l\n  prefix: p\n  colour: red\n", `unknown key "colour"`},
		{"not-a-header", "plugin_abi:\n  major: 1\n  minor: 0\n  header: a.c\n  loader: l\n  prefix: p\n", `is not a .h file`},
		{"bad-major", "plugin_abi:\n  major: 0\n  minor: 0\n  header: a.h\n  loader: l\n  prefix: p\n", `major: expected an integer of at least 1`},
		{"minor-out-of-order", "plugin_abi:\n  major: 1\n  minor: 2\n  header: a.h\n  loader: l\n  prefix: p\n  minors:\n    \"2\": [DeviceAllocator.Free]\n", `minor 2 out of order`},
		{"unknown-slot", "plugin_abi:\n  major: 1\n  minor: 1\n  header: a.h\n  loader: l\n  prefix: p\n  minors:\n    \"1\": [DeviceAllocator.Nope]\n", `"DeviceAllocator.Nope" is not a Capability.Method`},
		{"slot-twice", "plugin_abi:\n  major: 1\n  minor: 2\n  header: a.h\n  loader: l\n  prefix: p\n  minors:\n    \"1\": [DeviceAllocator.Free]\n    \"2\": [DeviceAllocator.Free]\n", `slot "DeviceAllocator.Free" added twice`},
		{"plugin-device", "plugin_abi:\n  major: 1\n  minor: 0\n  header: a.h\n  loader: l\n  prefix: p\n  plugins:\n    x: {device: Toaster, offers: [DeviceAllocator], doc: d}\n", `device "Toaster" is not a DeviceKind value`},
		{"plugin-offers", "plugin_abi:\n  major: 1\n  minor: 0\n  header: a.h\n  loader: l\n  prefix: p\n  plugins:\n    x: {device: Host, offers: [VirtualBacking], doc: d}\n", `must offer required capability DeviceAllocator`},
		{"limits-unknown-slot", "plugin_abi:\n  major: 1\n  minor: 0\n  header: a.h\n  loader: l\n  prefix: p\n  limits:\n    DeviceAllocator.Nope: text\n", `plugin_abi.limits: "DeviceAllocator.Nope" is not a Capability.Method`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := cabiSpec(t, "\n"+c.block)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), specName+":") {
				t.Errorf("Load = %v, want an error containing %q with its position", err, c.want)
			}
		})
	}
}

// TestCLayoutPadding: members are aligned naturally and the size rounded to
// the largest alignment, as a C compiler lays them out (LP64).
func TestCLayoutPadding(t *testing.T) {
	s := &cStruct{Fields: []*cField{
		{C: "a", size: 4, align: 4},
		{C: "b", size: 8, align: 8},
		{C: "c", size: 4, align: 4},
	}}
	s.layout()
	if got := []int{s.Fields[0].Off, s.Fields[1].Off, s.Fields[2].Off, s.Size}; got[0] != 0 || got[1] != 8 || got[2] != 16 || got[3] != 24 {
		t.Errorf("offsets a, b, c and size = %v, want [0 8 16 24]", got)
	}
}

// TestCABIDrift: memgen check's drift detection covers the header. A header
// edited by hand differs from what the spec generates, and a header memgen
// wrote that the spec no longer produces (plugin_abi removed) is stale.
func TestCABIDrift(t *testing.T) {
	block, err := os.ReadFile(filepath.Join(cabiCase, "plugin_abi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := cabiSpec(t, string(block))
	if err != nil {
		t.Fatal(err)
	}
	files, err := Generate(s, Config{Module: goldenModule})
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if _, _, err := Write(root, files); err != nil {
		t.Fatal(err)
	}
	h := filepath.Join(root, filepath.FromSlash(s.PluginABI.Header))
	data, err := os.ReadFile(h)
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.WriteFile(h, append(data, "/* edited */\n"...), 0o644))
	changed, _, err := Diff(root, files)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(changed, s.PluginABI.Header) {
		t.Errorf("Diff reported %v as changed, not the edited header", changed)
	}
	plain, err := cabiSpec(t, "")
	if err != nil {
		t.Fatal(err)
	}
	without, err := Generate(plain, Config{Module: goldenModule})
	if err != nil {
		t.Fatal(err)
	}
	_, stale, err := Diff(root, without)
	if err != nil {
		t.Fatal(err)
	}
	// A spec without the block declares no header, so its directory is no
	// longer one memgen writes: generate removes stale files only where it
	// writes (Owned), and the old header is left for its owner to delete.
	if slices.Contains(stale, s.PluginABI.Header) {
		t.Errorf("Diff reported %v as stale: the header lies outside every output directory of a spec without plugin_abi", stale)
	}
}
