package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain runs the test binary as plugin-check's child process when
// plugin-check, run by a test, starts it as it starts the memgen binary.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

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

// TestPluginCheckIsolates: plugin-check runs the plugin in a child process,
// so a plugin that hangs or crashes is reported as a finding naming the
// subtest and the call (and the bound, or the signal), and plugin-check
// itself exits 1 instead of hanging or dying; its concurrency pass, with
// verification off, catches a handle table without a lock. Only the hanging
// variant gets a short per-call bound: the others keep the default, which
// no call of a working plugin comes near on a loaded machine.
func TestPluginCheckIsolates(t *testing.T) {
	for _, c := range []struct {
		name, src, define string
		flags             []string
		want              []string
	}{
		{"hanging-commit", "refhost.c", "REFHOST_HANG_COMMIT", []string{"-call-timeout=2s"},
			[]string{"--- HANG: bare/", "slot commit did not return within 2s"}},
		{"lockless-table", "broken.c", "BROKEN_LOCKLESS", nil,
			[]string{"bare: ", " 0 failed", "--- FAIL: concurrency/stress"}},
		{"unmapped-commit", "refhost.c", "REFHOST_UNMAPPED_COMMIT", nil,
			[]string{"--- CRASH: bare/", "SIGSEGV"}},
		{"overrun-out", "refhost.c", "REFHOST_OVERRUN_OUT", nil,
			[]string{"--- CRASH: bare/", "SIGSEGV", "during Mechanism.Allocate"}},
		{"overrun-dst", "refhost.c", "REFHOST_OVERRUN_DST", nil,
			[]string{"--- CRASH: bare/", "SIGSEGV", "during Stream.CopyFromDevice"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errb strings.Builder
			args := append(append([]string{"plugin-check"}, c.flags...), buildPlugin(t, c.src, c.define))
			if code := run(args, &out, &errb); code != exitSpec {
				t.Fatalf("plugin-check: exit %d, want 1\n%s%s", code, out.String(), errb.String())
			}
			for _, want := range append(c.want, "memgen plugin-check: FAIL") {
				if !strings.Contains(out.String(), want) {
					t.Errorf("the report lacks %q:\n%s%s", want, out.String(), errb.String())
				}
			}
		})
	}
}
