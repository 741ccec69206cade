package xproctest

import (
	"path/filepath"
	"testing"

	"github.com/memgen/memgen/governor/xproc"
)

// NewLedger creates a shared ledger of capacity bytes and 8 slots in the
// test's temporary directory and returns its path; nothing has joined it.
func NewLedger(t testing.TB, capacity uint64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger")
	l, err := xproc.Open(path, xproc.Options{Create: &xproc.CreateOptions{Capacity: capacity, Slots: 8}})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}
