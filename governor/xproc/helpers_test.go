package xproc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// ledgerPath returns a fresh ledger path in the test's temporary directory.
func ledgerPath(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "ledger")
}

// member opens the ledger at path (creating it with capacity and slots),
// binds a governor's authority "dev" with holder "h" registered, and
// closes them at cleanup.
func member(t testing.TB, path string, capacity uint64, o Options) (*Ledger, *authority, *governor.Governor) {
	t.Helper()
	if o.Create == nil {
		o.Create = &CreateOptions{Capacity: capacity, Slots: 16}
	}
	if o.Poll == 0 {
		o.Poll = 20 * time.Millisecond
	}
	l, err := Open(path, o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	g := governor.New(governor.Options{})
	a, err := l.bind(g, "dev")
	if err != nil {
		t.Fatalf("Bind: %v", err)
	}
	if err := g.Register("h", nil, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil && !errors.Is(err, errInUse) {
			t.Errorf("Close: %v", err)
		}
		g.Close()
	})
	return l, a, g
}

// inspect reads the ledger at path, failing the test on error.
func inspect(t testing.TB, path string) (Header, []Slot) {
	t.Helper()
	h, s, err := Inspect(path)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return h, s
}

// take reserves, draws whole and commits n bytes.
func take(t testing.TB, a *authority, n memapi.Bytes) governor.Lease {
	t.Helper()
	gr, err := a.Reserve(context.Background(), governor.Request{Holder: "h", Role: "r", Bytes: n})
	if err != nil {
		t.Fatalf("Reserve %d: %v", n, err)
	}
	if err := gr.Draw(n); err != nil {
		t.Fatal(err)
	}
	ls, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// isOverBudget reports whether err is an over-budget refusal.
func isOverBudget(err error) bool { return errors.Is(err, memapi.ErrOverBudget) }

// Reserve is governor.Reserve on the bound authority (r.Authority is set
// to it); after Close it fails with errClosed.
func (a *authority) Reserve(ctx context.Context, r governor.Request) (governor.Grant, error) {
	if a.released.Load() {
		return governor.Grant{}, &ledgerError{Op: "xproc.Reserve", Path: a.l.path, Err: errClosed}
	}
	r.Authority = a.id
	return a.g.Reserve(ctx, r)
}

// Settle is settle with a context bounded by the ledger's lock timeout.
func (a *authority) Settle() error {
	ctx, cancel := context.WithTimeout(context.Background(), a.l.lockTimeout)
	defer cancel()
	return a.settle(ctx)
}
