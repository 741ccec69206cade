package example

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// TestContextLifecycle: a context refuses to close while a stream is open and
// refuses new streams once closed; a closed stream refuses copies and
// fences, and closing it twice is harmless.
func TestContextLifecycle(t *testing.T) {
	c := NewContext(New(Options{}))
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); !errors.Is(err, memapi.ErrInUse) {
		t.Fatalf("Close with a stream open: %v, want ErrInUse", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("a second stream Close: %v, want nil", err)
	}
	if err := s.CopyToDevice(1<<40, []byte{1}); !errors.Is(err, memapi.ErrClosed) {
		t.Errorf("CopyToDevice on a closed stream: %v, want ErrClosed", err)
	}
	if _, err := s.Record(); !errors.Is(err, memapi.ErrClosed) {
		t.Errorf("Record on a closed stream: %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close with every stream closed: %v", err)
	}
	if _, err := c.NewStream(); !errors.Is(err, memapi.ErrClosed) {
		t.Errorf("NewStream after Close: %v, want ErrClosed", err)
	}
}

// TestStreamErrors: a copy that fails is accepted when enqueued; its error
// shows at the fences recorded after it and at the next Synchronize, which
// forgets it. An overlapping CopyDevice moves the bytes as memmove would.
func TestStreamErrors(t *testing.T) {
	ctx := context.Background()
	m := New(Options{})
	c := NewContext(m)
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	a, err := m.Allocate(ctx, memapi.AllocRequest{Size: 8}, grant{})
	if err != nil {
		t.Fatal(err)
	}
	before, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	past := a.Addr() + memapi.DeviceAddr(a.Size()) - 1
	if err := s.CopyToDevice(past, []byte{1, 2}); err != nil {
		t.Fatalf("a copy is refused at enqueue: %v, want its error at the fence", err)
	}
	after, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	if err := before.Wait(ctx); err != nil {
		t.Errorf("a fence recorded before the failed copy: %v", err)
	}
	if err := after.Wait(ctx); !errors.Is(err, memapi.ErrInvalidRange) || !after.Done() {
		t.Errorf("the fence after a copy past the allocation: %v, want ErrInvalidRange", err)
	}
	if err := s.Synchronize(ctx); !errors.Is(err, memapi.ErrInvalidRange) {
		t.Errorf("Synchronize: %v, want ErrInvalidRange", err)
	}
	if err := s.Synchronize(ctx); err != nil {
		t.Errorf("a second Synchronize: %v, want the error forgotten", err)
	}

	for _, err := range []error{
		s.CopyToDevice(a.Addr(), []byte("abcdefgh")),
		s.CopyDevice(a.Addr()+2, a.Addr(), 6),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, 8)
	if err := s.CopyFromDevice(got, a.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	if want := []byte("ababcdef"); !bytes.Equal(got, want) {
		t.Errorf("after an overlapping CopyDevice: %q, want %q", got, want)
	}
}
