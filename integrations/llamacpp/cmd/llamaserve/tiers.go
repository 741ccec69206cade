package main

import (
	"fmt"
	"os"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/integrations/llamacpp"
)

// tierNotes returns an llamacpp.Options.OnMemoryEvent that notes each
// sleep, wake, offload and restore in this process's slot of the shared
// ledger l (xproc.Ledger.Note), for memctl show and memctl watch: its
// kind, level and bytes, and what the host tier holds after it, the
// charged bytes of authority tier in g read at the event. A move that
// failed notes the host tier's bytes alone (nothing counted, the sleep
// state as it was). It then calls next, when set.
//
// The engine calls the hook in the goroutine that made the move, maybe
// holding a context's lock: the notes are written in order by a goroutine
// of their own, so a move never waits for the ledger's lock. stop ends
// it once every note queued is written; the hook notes nothing after.
func tierNotes(l *xproc.Ledger, g *governor.Governor, tier memapi.AuthorityID, next func(llamacpp.MemoryEvent)) (hook func(llamacpp.MemoryEvent), stop func()) {
	var (
		mu      sync.Mutex
		queue   []xproc.TierEvent
		stopped bool
	)
	wake, done := make(chan struct{}, 1), make(chan struct{})
	go func() {
		defer close(done)
		for {
			<-wake
			mu.Lock()
			q, end := queue, stopped
			queue = nil
			mu.Unlock()
			for _, e := range q {
				if err := l.Note(e); err != nil {
					fmt.Fprintf(os.Stderr, "llamaserve: noting a %s in the ledger: %v\n", e.Kind, err)
				}
			}
			if end {
				return
			}
		}
	}()
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	hook = func(e llamacpp.MemoryEvent) {
		n := xproc.TierEvent{Kind: e.Kind, Level: e.Level, Bytes: uint64(e.Bytes), Time: e.Start.Add(e.Took)}
		if e.Err != nil {
			n = xproc.TierEvent{}
		}
		if s, ok := g.Authority(tier); ok {
			n.Host = uint64(s.Charged)
		}
		mu.Lock()
		if !stopped {
			queue = append(queue, n)
		}
		mu.Unlock()
		poke()
		if next != nil {
			next(e)
		}
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			mu.Lock()
			stopped = true
			mu.Unlock()
			poke()
			<-done
		})
	}
	return hook, stop
}
