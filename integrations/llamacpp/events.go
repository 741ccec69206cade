package llamacpp

import (
	"fmt"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/memreport"
)

// MemoryEvent is one move of a model's bytes between the device and the
// host tier (Options.OnMemoryEvent).
type MemoryEvent struct {
	// Kind is "sleep" or "wake" (the model's weights, and its contexts'
	// KV caches), "offload" or "restore" (a context's KV cache, under
	// pressure and at its next call).
	Kind string
	// Level is a sleep's or a wake's level (1 or 2); 0 for an offload or
	// a restore.
	Level int
	// Holder is the weights' holder (sleep, wake) or the context's
	// (offload, restore); Authority the device's.
	Holder    governor.HolderID
	Authority memapi.AuthorityID
	// Seq is the sequence an offload or a restore moved (0 otherwise).
	Seq int
	// Bytes is what the move gave back to the device (sleep, offload) or
	// took from it again (wake, restore).
	Bytes memapi.Bytes
	// Start is when the move began, Took how long it ran.
	Start time.Time
	Took  time.Duration
	// Err is why a sleep or wake failed (the model then as before, or what
	// was not restored still asleep); nil when it succeeded.
	Err error
}

// emit tells Options.OnMemoryEvent of e.
func (m *Model) emit(e MemoryEvent) {
	if m.opts.OnMemoryEvent != nil {
		m.opts.OnMemoryEvent(e)
	}
}

// emitMove tells Options.OnMemoryEvent of a sleep or a wake of the model
// at level that began at start and moved bytes.
func (m *Model) emitMove(kind string, level int, bytes memapi.Bytes, start time.Time, err error) {
	if m.opts.OnMemoryEvent == nil {
		return
	}
	e := MemoryEvent{Kind: kind, Level: level, Holder: m.holder, Bytes: bytes, Start: start, Took: time.Since(start), Err: err}
	e.Authority, _ = m.weights.Authority()
	m.emit(e)
}

// ReportMemoryEvents returns an Options.OnMemoryEvent that records each
// event in rec: an annotation on the device's timeline (its kind, the
// holder, the bytes, and in its detail the level and the time it took, or
// the error) and a span of its duration in the trace export.
func ReportMemoryEvents(rec *memreport.Recorder) func(MemoryEvent) {
	return func(e MemoryEvent) {
		detail := "took " + memreport.FormatDuration(e.Took)
		if e.Level != 0 {
			detail = fmt.Sprintf("level %d, %s", e.Level, detail)
		}
		if e.Err != nil {
			detail += ", failed: " + e.Err.Error()
		}
		end := e.Start.Add(e.Took)
		rec.Annotate(memreport.Annotation{Time: end, Authority: e.Authority, Kind: e.Kind, Holder: e.Holder, Bytes: e.Bytes, Detail: detail})
		rec.Span(fmt.Sprintf("%s %s", e.Kind, memreport.FormatBytes(e.Bytes)), "memory", e.Start, end)
	}
}
