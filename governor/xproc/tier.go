package xproc

import (
	"context"
	"slices"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// TierEvent is a move of a process's bytes between the device and its
// host tier, noted in its slot (Ledger.Note) for the operator to see
// (memctl show and memctl watch): a sleep or a wake of its engine, an
// offload of a KV cache or its restore. The ledger admits and refuses
// nothing by them: the device bytes a move gives back or takes are in the
// slot's figures as always.
type TierEvent struct {
	// Kind is "sleep", "wake", "offload" or "restore". "" notes Host
	// alone (after a move that failed, say): nothing is counted and the
	// sleep state stays.
	Kind string
	// Level is a sleep's or a wake's level, 1 or 2 (a wake's is the level
	// of the sleep it ends); 0 for an offload or a restore.
	Level int
	// Bytes is what the move gave back to the device or took from it.
	Bytes uint64
	// Host is what the process holds on its host tier after the move.
	Host uint64
	// Time is when the move ended; zero means when it is noted.
	Time time.Time
}

// tierKinds are TierEvent's kinds; a slot's sLast word keeps the index+1.
var tierKinds = [...]string{"sleep", "wake", "offload", "restore"}

// tierCount is the slot word that counts each kind, in tierKinds' order.
var tierCount = [...]int{sSleeps, sWakes, sOffloads, sRestores}

// Note records e in this process's slot, under the ledger's lock (waiting
// for it at most the ledger's LockTimeout): the host tier's bytes, the
// sleep state (a sleep's level, 0 after a wake), the count of e's kind and
// e as the last move. A kind or a level it does not know is
// memapi.ErrUnsupported, a figure beyond a ledger's
// memapi.ErrInvalidSize; both change nothing. Each word is one store, as
// every word of the file: a process that dies in a Note leaves a slot the
// next lock holder accepts, and its slot (tier figures and all) is
// reclaimed.
func (l *Ledger) Note(e TierEvent) error {
	const op = "xproc.Note"
	k := slices.Index(tierKinds[:], e.Kind)
	switch {
	case k < 0 && e.Kind != "":
		return memapi.Errorf(op, memapi.ErrUnsupported, "kind %q: want sleep, wake, offload, restore or \"\"", e.Kind)
	case k >= 0 && k < 2 && e.Level != 1 && e.Level != 2:
		return memapi.Errorf(op, memapi.ErrUnsupported, "a %s at level %d: want 1 or 2", e.Kind, e.Level)
	case k >= 2 && e.Level != 0:
		return memapi.Errorf(op, memapi.ErrUnsupported, "an %s at level %d: an offload or a restore has none", e.Kind, e.Level)
	case e.Bytes > maxBytes || e.Host > maxBytes:
		return memapi.Errorf(op, memapi.ErrInvalidSize, "%d bytes moved, %d on the host tier: beyond %d", e.Bytes, e.Host, maxBytes)
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.lockTimeout)
	defer cancel()
	if err := l.lock(ctx, op); err != nil {
		return err
	}
	defer l.unlock()
	l.store(l.sw(l.slot, sHost), e.Host)
	if k < 0 {
		return nil
	}
	l.store(l.sw(l.slot, sLastBytes), e.Bytes)
	l.store(l.sw(l.slot, sLastTime), uint64(max(e.Time.UnixNano(), 0)))
	l.store(l.sw(l.slot, sLast), uint64(k+1)|uint64(e.Level)<<8)
	l.add(l.sw(l.slot, tierCount[k]), 1)
	switch e.Kind {
	case "sleep":
		l.store(l.sw(l.slot, sAsleep), uint64(e.Level))
	case "wake":
		l.store(l.sw(l.slot, sAsleep), 0)
	}
	return nil
}

// lastMove decodes a slot's sLast, sLastBytes and sLastTime words (ok
// false: a word no Note writes).
func lastMove(last, bytes, at uint64) (TierEvent, bool) {
	if last == 0 {
		return TierEvent{}, bytes == 0 && at == 0
	}
	k, level := last&0xff, last>>8
	if k < 1 || k > uint64(len(tierKinds)) || level > 2 || (k <= 2) != (level != 0) || bytes > maxBytes || at > 1<<63-1 {
		return TierEvent{}, false
	}
	return TierEvent{Kind: tierKinds[k-1], Level: int(level), Bytes: bytes, Time: time.Unix(0, int64(at))}, true
}
