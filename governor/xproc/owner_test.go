package xproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

const ownerEnv = "MEMGEN_XPROC_OWNER" // childOwner: the ledger to open

// childOwner: open the ledger at MEMGEN_XPROC_OWNER (run as another user
// that can open any file, CAP_DAC_OVERRIDE) and say what came of it.
func childOwner() error {
	_, _, err := Inspect(os.Getenv(ownerEnv))
	switch {
	case err == nil:
		fmt.Println("accepted")
	case errors.Is(err, errUnsafe):
		fmt.Println("unsafe")
	default:
		fmt.Println("error", err)
	}
	return nil
}

// A process that can open any file (here a user with CAP_DAC_OVERRIDE, not
// root) refuses a ledger owned by another user (not root) unless it is a
// 0660 file of one of its groups, and accepts its own.
func TestLedgerOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a helper as another user")
	}
	const uid, gid = 65534, 65534
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The helper: this binary, where the other user can run it.
	bin := filepath.Join(dir, "xproc.test")
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	valid := dir + "/valid"
	var l *Ledger
	l, err = Open(valid, Options{Create: &CreateOptions{Capacity: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	b, _ := os.ReadFile(valid)
	for _, c := range []struct {
		name     string
		uid, gid int
		mode     os.FileMode
		want     string
	}{
		{"a stranger's 0600", 4242, 4242, 0o600, "unsafe"},
		{"a stranger's 0660 of another group", 4242, 4242, 0o660, "unsafe"},
		{"a stranger's 0660 of its group", 4242, gid, 0o660, "accepted"},
		{"its own", uid, 4242, 0o600, "accepted"},
		{"root's", 0, 0, 0o600, "accepted"},
	} {
		p := dir + "/" + fmt.Sprint(c.uid, c.gid, c.mode)
		writeFile(t, p, b)
		if err := os.Chown(p, c.uid, c.gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, c.mode); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=owner", ownerEnv+"="+p)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{gid}},
			AmbientCaps: []uintptr{1}} // CAP_DAC_OVERRIDE
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: helper: %v %s", c.name, err, out)
		}
		if got := string(out); got != c.want+"\n" {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
