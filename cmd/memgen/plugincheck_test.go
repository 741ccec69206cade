package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildPlugin compiles a C plugin of mechanisms/plugin/testdata with the
// generated header, or skips without a C compiler.
func buildPlugin(t *testing.T, src string, defines ...string) string {
	t.Helper()
	compiler, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler: plugin-check needs a built plugin")
	}
	out := filepath.Join(t.TempDir(), "lib.so")
	args := []string{"-std=c11", "-fPIC", "-shared", "-pthread", "-I../../include", "-o", out, "../../mechanisms/plugin/testdata/" + src}
	for _, d := range defines {
		args = append(args, "-D"+d)
	}
	if b, err := exec.Command(compiler, args...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, b)
	}
	return out
}

// TestPluginCheck: plugin-check passes the minimal plugin (exit 0, a report
// with the plugin's descriptor and each run's counts), fails a plugin whose
// free leaves the memory mapped (exit 1, the failing subtest named), and
// refuses a path that is not a plugin (exit 1) and a missing path argument
// (exit 2).
func TestPluginCheck(t *testing.T) {
	var out, errb strings.Builder
	if code := run([]string{"plugin-check", buildPlugin(t, "minimal.c")}, &out, &errb); code != exitOK {
		t.Fatalf("plugin-check of the minimal plugin: exit %d\n%s%s", code, out.String(), errb.String())
	}
	for _, want := range []string{"plugin minimal: ABI 2.0, Host", "bare: ", "checked: ", " 0 failed", "memgen plugin-check: ok"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if code := run([]string{"plugin-check", buildPlugin(t, "broken.c", "BROKEN_LEAKY_FREE")}, &out, &errb); code != exitSpec {
		t.Fatalf("plugin-check of a leaking plugin: exit %d, want 1\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "--- FAIL: leak/freed-range-unmapped") || !strings.Contains(out.String(), "memgen plugin-check: FAIL") {
		t.Errorf("the report does not name the leak:\n%s", out.String())
	}
	errb.Reset()
	if code := run([]string{"plugin-check", filepath.Join(t.TempDir(), "absent.so")}, &out, &errb); code != exitSpec || !strings.Contains(errb.String(), "does not open") {
		t.Errorf("plugin-check of a missing file: exit %d, %q", code, errb.String())
	}
	if code := run([]string{"plugin-check"}, &out, &errb); code != exitUsage {
		t.Errorf("plugin-check without a path: exit %d, want 2", code)
	}
}
