//go:build memgentmpl

package fakes

import (
	"sync"
	"sync/atomic"
)

// Call is one recorded call to a fake: its global sequence number, the fake
// it went to (Source), the method, its arguments in order (byte slices are
// copied) and the error it returned (nil for success or for methods without
// an error result).
type Call struct {
	Seq    uint64
	Source string
	Method string
	Args   []any
	Err    error
}

// Recorder keeps the calls of every fake that shares it, in one global order:
// a mechanism, its contexts, streams and fences, and ledger fakes can all
// record into one Recorder, so a test can assert the interleaving (grant
// drawn before commit, free after the fence). A nil *Recorder records nothing.
// It is safe for concurrent use.
type Recorder struct {
	seq   atomic.Uint64
	mu    sync.Mutex
	calls []Call
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder { return &Recorder{} }

// record stamps c with the next sequence number (at completion, so Seq follows
// the order in which calls returned) and keeps it.
func (r *Recorder) record(c Call) {
	if r == nil {
		return
	}
	r.mu.Lock()
	c.Seq = r.seq.Add(1)
	r.calls = append(r.calls, c)
	r.mu.Unlock()
}

// Calls returns a copy of the recorded calls in global order.
func (r *Recorder) Calls() []Call {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Call(nil), r.calls...)
}

// Methods returns "Source.Method" for every recorded call, in order: a compact
// form for asserting sequences.
func (r *Recorder) Methods() []string {
	calls := r.Calls()
	out := make([]string, len(calls))
	for i, c := range calls {
		out[i] = c.Source + "." + c.Method
	}
	return out
}

// Reset forgets every recorded call; sequence numbers keep increasing.
func (r *Recorder) Reset() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.calls = nil
	r.mu.Unlock()
}

// cloneBytes copies a byte-slice argument, so a recorded call does not
// change when the caller reuses its buffer.
func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}
