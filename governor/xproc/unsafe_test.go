package xproc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/memgen/memgen/internal/watchdog"
)

// A FIFO, a symlink, and modes that let non-members in are refused with a
// typed error by Open and Inspect, at once (a FIFO used to hang Inspect).
func TestUnsafeLedgerFiles(t *testing.T) {
	dir := t.TempDir()
	valid := filepath.Join(dir, "valid")
	l, err := Open(valid, Options{Create: &CreateOptions{Capacity: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(valid, link); err != nil {
		t.Fatal(err)
	}
	modes := map[string]os.FileMode{}
	for _, m := range []os.FileMode{0o644, 0o666, 0o606, 0o700} {
		p := filepath.Join(dir, "mode"+m.String())
		b, _ := os.ReadFile(valid)
		writeFile(t, p, b)
		if err := os.Chmod(p, m); err != nil {
			t.Fatal(err)
		}
		modes[p] = m
	}
	paths := []string{fifo, link, dir}
	for p := range modes {
		paths = append(paths, p)
	}
	for _, p := range paths {
		for name, f := range map[string]func() error{
			"Inspect": func() error { _, _, err := Inspect(p); return err },
			"Open": func() error {
				l, err := Open(p, Options{})
				if err == nil {
					l.Close()
				}
				return err
			},
			"SetCapacity": func() error { _, err := SetCapacity(context.Background(), p, 10, 0); return err },
		} {
			took, done, err := bounded(watchdog.Bound, f)
			if err == nil || took >= watchdog.Bound {
				// Let a reader stuck on the FIFO go.
				if w, e := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); e == nil {
					w.Close()
				}
				<-done
				t.Errorf("%s of %s: %v after %v, want a typed refusal at once", name, filepath.Base(p), err, took)
				continue
			}
			if !isUnsafe(err) {
				t.Errorf("%s of %s: %v, want ErrUnsafe", name, filepath.Base(p), err)
			}
		}
	}
	if _, _, err := Inspect(valid); err != nil {
		t.Fatalf("the valid ledger: %v", err)
	}
}

func isUnsafe(err error) bool {
	var le *ledgerError
	return errors.As(err, &le) && errors.Is(err, errUnsafe)
}
