package main

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/integrations/llamacpp"
	"github.com/memgen/memgen/internal/xproctest"
)

// tierNotes notes each memory event in the process's slot, with the host
// tier's charged bytes at the event, a failed one as the host tier's bytes
// alone, and hands every event on to the hook it composes with; after stop
// nothing more is noted. No llama.cpp needed: the events are made here.
func TestTierNotes(t *testing.T) {
	path := xproctest.NewLedger(t, 1<<30)
	l, err := xproc.Open(path, xproc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	g := governor.New(governor.Options{})
	defer g.Close()
	if err := g.AddAuthority("offload", 1<<30); err != nil {
		t.Fatal(err)
	}
	if err := g.Register("llama/sleep", nil, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	var passed []string
	hook, stop := tierNotes(l, g, "offload", func(e llamacpp.MemoryEvent) { passed = append(passed, e.Kind) })
	start := time.Now()
	event := func(kind string, level int, bytes memapi.Bytes, err error) llamacpp.MemoryEvent {
		return llamacpp.MemoryEvent{Kind: kind, Level: level, Holder: "llama/weights", Authority: "host", Bytes: bytes, Start: start, Took: time.Millisecond, Err: err}
	}
	// The sleep's copies are charged to the host tier before the event.
	gr, err := g.Reserve(context.Background(), governor.Request{Authority: "offload", Holder: "llama/sleep", Role: "host-copy", Bytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := gr.Draw(64 << 20); err != nil {
		t.Fatal(err)
	}
	ls, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	hook(event("sleep", 1, 70<<20, nil))
	hook(event("wake", 1, 0, errors.New("the wake failed"))) // still asleep
	if err := ls.Refund(64 << 20); err != nil {
		t.Fatal(err)
	}
	hook(event("wake", 1, 70<<20, nil))
	hook(event("offload", 0, 8<<20, nil))
	stop()
	hook(event("restore", 0, 8<<20, nil)) // after stop: handed on, not noted
	stop()
	_, slots, err := xproc.Inspect(path)
	if err != nil {
		t.Fatal(err)
	}
	var s xproc.Slot
	for _, x := range slots {
		if x.PID == os.Getpid() {
			s = x
		}
	}
	if s.Sleeps != 1 || s.Wakes != 1 || s.Offloads != 1 || s.Restores != 0 || s.Asleep != 0 || s.Host != 0 ||
		s.Last.Kind != "offload" || s.Last.Bytes != 8<<20 || !s.Last.Time.Equal(start.Add(time.Millisecond).Round(0)) {
		t.Fatalf("the slot after sleep, a failed wake, wake, offload: %+v", s)
	}
	if want := []string{"sleep", "wake", "wake", "offload", "restore"}; !slices.Equal(passed, want) {
		t.Fatalf("the composed hook saw %q, want %q", passed, want)
	}
}

// A sleep notes what the host tier holds at the event: the tier's charged
// bytes.
func TestTierNotesHostBytes(t *testing.T) {
	path := xproctest.NewLedger(t, 1<<30)
	l, err := xproc.Open(path, xproc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	g := governor.New(governor.Options{})
	defer g.Close()
	_ = g.AddAuthority("offload", 1<<30)
	_ = g.Register("llama/sleep", nil, governor.HolderOptions{})
	gr, err := g.Reserve(context.Background(), governor.Request{Authority: "offload", Holder: "llama/sleep", Role: "host-copy", Bytes: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	_ = gr.Draw(32 << 20)
	if _, err := gr.Commit(); err != nil {
		t.Fatal(err)
	}
	hook, stop := tierNotes(l, g, "offload", nil)
	hook(llamacpp.MemoryEvent{Kind: "sleep", Level: 1, Bytes: 40 << 20, Start: time.Now()})
	stop()
	_, slots, err := xproc.Inspect(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range slots {
		if x.PID == os.Getpid() && (x.Host != 32<<20 || x.Asleep != 1 || x.Sleeps != 1) {
			t.Fatalf("after a sleep with 32 MiB on the host tier: %+v", x)
		}
	}
}
