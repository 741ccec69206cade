package example

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// grant is a grant for the bare mechanism, which only checks that one is
// passed: drawing is the checked wrapper's work.
type grant struct{}

func (grant) Authority() memapi.AuthorityID { return "host" }
func (grant) Draw(memapi.Bytes) error       { return nil }
func (grant) Undraw(memapi.Bytes) error     { return nil }

// wantOOM fails t unless err is ErrOutOfMemory saying that want bytes were
// asked for and avail were left.
func wantOOM(t *testing.T, what string, err error, want, avail memapi.Bytes) {
	t.Helper()
	var e *memapi.Error
	if !errors.Is(err, memapi.ErrOutOfMemory) || !errors.As(err, &e) {
		t.Fatalf("%s: %v, want ErrOutOfMemory", what, err)
	}
	if e.Wanted != want || e.Available != avail {
		t.Errorf("%s: wanted %d, available %d; want %d and %d", what, e.Wanted, e.Available, want, avail)
	}
}

// TestCapacity: allocations, commits, backings and private copies together
// hold at most Options.Capacity bytes; a call beyond it fails with
// ErrOutOfMemory naming the bytes wanted and left, and changes nothing.
func TestCapacity(t *testing.T) {
	ctx := context.Background()
	page := memapi.Bytes(os.Getpagesize())
	m := New(Options{Capacity: 4 * page})
	a, err := m.Allocate(ctx, memapi.AllocRequest{Size: 2 * page}, grant{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Reserve(ctx, memapi.ReserveRequest{Size: 4 * page})
	if err != nil {
		t.Fatalf("Reserve of the whole capacity (address space, not memory): %v", err)
	}
	_, err = m.Reserve(ctx, memapi.ReserveRequest{Size: 5 * page})
	wantOOM(t, "Reserve beyond the capacity", err, 5*page, 4*page)

	wantOOM(t, "Commit of 3 pages with 2 left", m.Commit(ctx, res, memapi.Range{Len: 3 * page}, grant{}), 3*page, 2*page)
	if n, _ := m.CommittedBytes(res); n != 0 {
		t.Errorf("a refused Commit left %d bytes committed", n)
	}
	if err := m.Commit(ctx, res, memapi.Range{Len: page}, grant{}); err != nil {
		t.Fatal(err)
	}
	b, err := m.CreateBacking(ctx, page, grant{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Allocate(ctx, memapi.AllocRequest{Size: 1}, grant{})
	wantOOM(t, "Allocate with nothing left", err, page, 0)
	_, err = m.CreateBacking(ctx, page, grant{})
	wantOOM(t, "CreateBacking with nothing left", err, page, 0)

	v, err := m.MapView(ctx, res, memapi.Range{Off: page, Len: page}, b, memapi.AccessReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.CopyOnWrite(ctx, v, grant{})
	wantOOM(t, "CopyOnWrite with nothing left", err, page, 0)
	if !v.Live() {
		t.Fatal("a refused CopyOnWrite released the view")
	}
	if n, _ := m.ViewCount(b); n != 1 {
		t.Errorf("after a refused CopyOnWrite the backing has %d views, want 1", n)
	}
	if got := m.UsedBytes(); got != 4*page {
		t.Errorf("UsedBytes = %d, want the capacity %d", got, 4*page)
	}

	if err := m.Free(ctx, a, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CopyOnWrite(ctx, v, grant{}); err != nil {
		t.Errorf("CopyOnWrite once Free made room: %v", err)
	}
}

// TestAllocateAlign: Allocate places an allocation at req.Align when it is
// larger than the granularity, and refuses an alignment that is not a power
// of two or is above 1 GiB.
func TestAllocateAlign(t *testing.T) {
	ctx := context.Background()
	m := New(Options{})
	for _, align := range []memapi.Bytes{1 << 20, 1 << 24} {
		for range 3 {
			a, err := m.Allocate(ctx, memapi.AllocRequest{Size: 1, Align: align}, grant{})
			if err != nil {
				t.Fatal(err)
			}
			if a.Addr()%memapi.DeviceAddr(align) != 0 {
				t.Errorf("Allocate(Align %#x) at %#x", align, a.Addr())
			}
		}
	}
	for _, align := range []memapi.Bytes{3, 3 << 12, 2 << 30} {
		if _, err := m.Allocate(ctx, memapi.AllocRequest{Size: 1, Align: align}, grant{}); !errors.Is(err, memapi.ErrInvalidSize) {
			t.Errorf("Allocate(Align %d): %v, want ErrInvalidSize", align, err)
		}
	}
}
