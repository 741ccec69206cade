package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/memgen/memgen/governor/xproc"
)

func memctl(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// create, show, and each outcome of set-capacity; a bad file is a typed
// error with exit code 1; bad arguments are usage errors.
func TestMemctl(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	if code, out, e := memctl("create", path, "64M", "8"); code != 0 || !strings.Contains(out, "capacity 67108864") {
		t.Fatalf("create: %d %q %q", code, out, e)
	}
	code, out, _ := memctl("show", path)
	if code != 0 || !strings.Contains(out, "revision 1, 8 slots") || !strings.Contains(out, "capacity 67108864  claimed 0") {
		t.Fatalf("show: %d %q", code, out)
	}
	l, err := xproc.Open(path, xproc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	code, out, _ = memctl("show", path)
	l.Close()
	if code != 0 || !strings.Contains(out, " "+strconv.Itoa(os.Getpid())+" ") {
		t.Fatalf("show with a member: %q", out)
	}
	if code, out, _ := memctl("set-capacity", path, "32M", "1"); code != 0 || !strings.HasPrefix(out, "applied: revision 2, capacity 33554432") {
		t.Fatalf("set-capacity: %d %q", code, out)
	}
	if code, out, _ := memctl("set-capacity", path, "16M", "1"); code != 0 || !strings.HasPrefix(out, "refused: revision 2") || !strings.Contains(out, "stale revision 1") {
		t.Fatalf("stale set-capacity: %d %q", code, out)
	}
	if code, _, _ := memctl("set-capacity", path, "0"); code != 2 {
		t.Fatalf("capacity 0: exit %d", code)
	}
	if code, _, _ := memctl("create", path, "1M"); code != 1 {
		t.Fatalf("create over an existing file: exit %d", code)
	}
	bad := filepath.Join(t.TempDir(), "bad")
	os.WriteFile(bad, []byte("definitely not a ledger, long enough to hold a header of a hundred and twenty-eight bytes......................................................"), 0o600)
	if code, _, e := memctl("show", bad); code != 1 || !strings.Contains(e, "not a ledger file") {
		t.Fatalf("show of a foreign file: %d %q", code, e)
	}
	if code, _, _ := memctl("show"); code != 2 {
		t.Fatalf("no path: exit %d", code)
	}
}
