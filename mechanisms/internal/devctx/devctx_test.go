package devctx

import (
	"errors"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

func TestStreams(t *testing.T) {
	var b Streams[*int]
	made := 0
	create := func() (*int, error) { made++; return new(int), nil }
	s, err := b.Open("m", create)
	if err != nil || s == nil {
		t.Fatalf("Open: %v, %v", s, err)
	}
	if err := b.Close("m"); !errors.Is(err, memapi.ErrInUse) || err.Error() == "" {
		t.Fatalf("Close with a stream open: %v, want ErrInUse", err)
	}
	var me *memapi.Error
	if err := b.Close("m"); !errors.As(err, &me) || me.Op != "DeviceContext.Close" || me.Mechanism != "m" || me.Detail != "1 streams are open" {
		t.Fatalf("Close with a stream open: %#v", me)
	}
	failed := errors.New("create failed")
	if _, err := b.Open("m", func() (*int, error) { return nil, failed }); err != failed {
		t.Fatalf("Open with a failing create: %v", err)
	}
	b.Closed(s)
	if err := b.Close("m"); err != nil {
		t.Fatalf("Close with no stream open: %v", err)
	}
	if err := b.Close("m"); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	if _, err := b.Open("m", create); !errors.As(err, &me) || me.Kind != memapi.ErrClosed || me.Op != "DeviceContext.NewStream" || made != 1 {
		t.Fatalf("Open after Close: %v (create called %d times), want ErrClosed without a call", err, made)
	}
}
