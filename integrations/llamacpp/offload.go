package llamacpp

/*
#include "bridge.h"
*/
import "C"

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pmm"
)

// Preemption gives up a context's sequences one at a time, each victim
// either offloaded or recomputed (the holder's policy, per victim):
//
//   - offload: every KV tensor's rows of the victim are copied to the host
//     tier and decommitted (pmm.Region.Offload with the sequence's range:
//     the host tier charged before the copy, the device released after
//     it); llama.cpp's cells of it are kept, and the next DecodeBatch that
//     names it copies them back (Offloaded.Restore) before it decodes;
//   - recompute: llama.cpp's cells of the victim are removed
//     (llama_memory_seq_rm) and its ranges decommitted behind the decode
//     fences; its tokens are kept, and the next DecodeBatch that names it
//     decodes them again first.
//
// A sequence is whole in one of three states at every step: resident,
// offloaded (every tensor's rows of it in the host tier) or dropped (no
// cell, no row). A move that fails part-way is undone (an offload's moved
// tensors restored, a restore's restored tensors offloaded again); should
// the undo fail too, the sequence is dropped (its host copies discarded)
// and recomputed when next named.

// Preemption policies (ContextOptions.Preempt).
const (
	preemptAuto      = ""
	preemptOffload   = "offload"
	preemptRecompute = "recompute"
)

// decoding marks the context of a DecodeBatch's room-making reservation
// (makeRoom): a Reclaim called with it while the reservation is under way
// (the governor calls a holder's Reclaim in the reservation's goroutine)
// runs in the goroutine of that call, which holds the context's lock, and
// may preempt the sequences the call does not name.
type decoding struct {
	c      *Context
	named  map[int]bool
	active bool // the reservation is under way
}

type decodingKey struct{}

// Reclaim is the context's answer to a pressure ticket on its device: it
// gives up whole sequences, one victim at a time, until t.Wanted bytes are
// freed or no victim is left, and returns the bytes given up. A context
// with a call in progress gives nothing, except to the reservation its own
// DecodeBatch makes before it restores or grows (makeRoom): then the
// sequences that call does not name are the victims. Victims are taken in
// order: finished sequences (FinishSeq) first, then the others by the most
// KV bytes on the device, then the lowest sequence; a sequence without
// cells on the device (none yet, dropped, or offloaded) is never one. Each
// victim is offloaded or recomputed by the context's policy
// (ContextOptions.Preempt).
func (c *Context) Reclaim(ctx context.Context, t governor.Ticket) (memapi.Bytes, error) {
	var named map[int]bool
	if d, ok := ctx.Value(decodingKey{}).(*decoding); ok && d.c == c && d.active {
		named = d.named // the call holding c.mu, in this goroutine
	} else {
		if !c.mu.TryLock() {
			return 0, nil
		}
		defer c.mu.Unlock()
	}
	if c.closed || c.asleep || t.Authority != c.authority() {
		return 0, nil
	}
	var freed memapi.Bytes
	var errs []error
	for _, s := range c.victims(named) {
		if freed >= t.Wanted {
			break
		}
		n, err := c.preemptSeq(ctx, s)
		freed += n
		if err != nil {
			errs = append(errs, fmt.Errorf("sequence %d: %w", s, err))
		}
	}
	return freed, errors.Join(errs...)
}

// victims is the sequences Reclaim may give up, in its order (c.mu held):
// those with KV bytes on the device and not in named.
func (c *Context) victims(named map[int]bool) []int {
	type victim struct {
		s        int
		finished bool
		bytes    memapi.Bytes
	}
	var vs []victim
	for s, sq := range c.seqs {
		if named[s] || sq.cells == 0 || sq.moved != nil {
			continue
		}
		if n := c.seqBytes(s); n > 0 {
			vs = append(vs, victim{s, sq.finished, n})
		}
	}
	slices.SortFunc(vs, func(a, b victim) int {
		if a.finished != b.finished {
			if a.finished {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.bytes, a.bytes), cmp.Compare(a.s, b.s))
	})
	out := make([]int, len(vs))
	for i, v := range vs {
		out[i] = v.s
	}
	return out
}

// seqBytes is what sequence s's ranges commit on the device.
func (c *Context) seqBytes(s int) memapi.Bytes {
	if c.seqs[s].moved != nil {
		return 0
	}
	var n memapi.Bytes
	for _, t := range c.tensors {
		n += t.backed[s]
	}
	return n
}

// preemptSeq gives sequence s up by the context's policy and returns the
// device bytes it gave back. Under Preempt "offload" it is offloaded (and
// left resident when the move fails); under "recompute" dropped; under
// the automatic policy it is offloaded when the context has a host tier,
// the sequence is not finished (a finished one is not expected back) and
// the host tier's authority has its bytes free, and dropped otherwise or
// when the move fails.
func (c *Context) preemptSeq(ctx context.Context, s int) (memapi.Bytes, error) {
	var offErr error
	if c.offloadTo != nil && (c.preempt == preemptOffload ||
		c.preempt == preemptAuto && !c.seqs[s].finished && c.hostRoom(c.seqBytes(s))) {
		n, err := c.offloadSeq(ctx, s)
		if err == nil || c.seqs[s].cells == 0 || c.preempt == preemptOffload {
			// Offloaded; or dropped by an undo that failed; or resident
			// again, as the policy wants.
			return n, err
		}
		offErr = err
	}
	n, err := c.dropSeq(ctx, s)
	if err == nil {
		c.stats.Preemptions++
	}
	return n, errors.Join(offErr, err)
}

// hostRoom reports whether the host tier's authority has n bytes free
// (the governor's snapshot).
func (c *Context) hostRoom(n memapi.Bytes) bool {
	a, err := c.offloadTo.Authority()
	if err != nil {
		return false
	}
	s, ok := c.m.opts.Governor.Authority(a)
	return ok && s.Free >= n
}

// seqRanges is sequence s's committed range of tensor t for Offload: none
// with one stream (the region's committed backing is the sequence's).
func (t *kvTensor) seqRanges(s int) []memapi.Range {
	if len(t.backed) == 1 {
		return nil
	}
	return []memapi.Range{{Off: memapi.Bytes(s) * t.stride, Len: t.backed[s]}}
}

// offloadSeq moves sequence s's rows of every KV tensor to the host tier
// (c.mu held) and returns the device bytes given back. On a failure the
// tensors moved are restored and the error returned, the sequence resident
// as before; should a restore fail, the sequence is dropped (its cells
// removed, its host copies discarded, its other ranges decommitted).
func (c *Context) offloadSeq(ctx context.Context, s int) (memapi.Bytes, error) {
	start := time.Now()
	moved := make([]*pmm.Offloaded, len(c.tensors))
	var n memapi.Bytes
	for i, t := range c.tensors {
		if t.backed[s] == 0 {
			continue
		}
		o, err := t.region.Offload(ctx, c.offloadTo, t.seqRanges(s)...)
		if o != nil {
			moved[i] = o
			n += o.Bytes()
		}
		if err != nil {
			err = fmt.Errorf("offloading %s: %w", t.name, err)
			uctx := context.WithoutCancel(ctx)
			var left bool
			for j := i; j >= 0; j-- {
				if moved[j] == nil {
					continue
				}
				if rerr := moved[j].Restore(uctx); rerr != nil {
					err = errors.Join(err, fmt.Errorf("restoring %s: %w", c.tensors[j].name, rerr))
					left = true
					continue
				}
				moved[j] = nil
			}
			if !left {
				return 0, err
			}
			c.seqs[s].moved = moved
			freed, derr := c.dropSeq(uctx, s)
			if derr == nil {
				c.stats.Preemptions++
			}
			return freed, errors.Join(err, derr)
		}
	}
	c.seqs[s].moved = moved
	c.stats.Preemptions++
	c.stats.Offloads++
	c.stats.Moved += n
	took := time.Since(start)
	c.stats.MoveTime += took
	c.m.emit(MemoryEvent{Kind: "offload", Holder: c.holder, Authority: c.authority(), Seq: s, Bytes: n, Start: start, Took: took})
	return n, nil
}

// restoreSeq copies an offloaded sequence back from the host tier before
// a call decodes it (c.mu held): each tensor's rows are committed again,
// charged through the governor within ctx, and copied back. On a failure
// the tensors restored are offloaded again and the error returned, the
// sequence offloaded as before; should that fail, the sequence is dropped
// and recomputed when next named.
func (c *Context) restoreSeq(ctx context.Context, op string, s int) error {
	sq := &c.seqs[s]
	if sq.moved == nil {
		return nil
	}
	start := time.Now()
	var n memapi.Bytes
	var back []int
	for i, o := range sq.moved {
		if o == nil {
			continue
		}
		if err := o.Restore(ctx); err != nil {
			return c.unrestore(ctx, op, s, back, fmt.Errorf("restoring %s: %w", c.tensors[i].name, err))
		}
		sq.moved[i] = nil
		back = append(back, i)
		n += o.Bytes()
	}
	sq.moved = nil
	c.stats.Restores++
	c.stats.Moved += n
	took := time.Since(start)
	c.stats.MoveTime += took
	c.m.emit(MemoryEvent{Kind: "restore", Holder: c.holder, Authority: c.authority(), Seq: s, Bytes: n, Start: start, Took: took})
	return nil
}

// unrestore undoes a restore of sequence s that failed with err: the
// tensors in back move to the host tier again, last first.
func (c *Context) unrestore(ctx context.Context, op string, s int, back []int, err error) error {
	wrap := func(err error) error {
		return fmt.Errorf("%s: context %s: sequence %d from the host tier: %w", op, c.holder, s, err)
	}
	uctx := context.WithoutCancel(ctx)
	sq := &c.seqs[s]
	for j := len(back) - 1; j >= 0; j-- {
		i := back[j]
		t := c.tensors[i]
		o, oerr := t.region.Offload(uctx, c.offloadTo, t.seqRanges(s)...)
		if o != nil {
			sq.moved[i] = o
		}
		if oerr != nil {
			_, derr := c.dropSeq(uctx, s)
			return wrap(errors.Join(err, fmt.Errorf("offloading %s again: %w", t.name, oerr), derr))
		}
	}
	return wrap(err)
}

// dropSeq removes sequence s's cells and gives its ranges up (c.mu held):
// resident ones are decommitted behind the decode fences, offloaded ones'
// host copies discarded. Its tokens stay: the next call that names it
// recomputes them. It returns the device bytes given up (an offloaded
// range's count too: they left the device when it moved). llama.cpp
// refusing the removal changes nothing; a range that cannot be
// decommitted keeps its backing, which the next decode shrinks.
func (c *Context) dropSeq(ctx context.Context, s int) (memapi.Bytes, error) {
	sq := &c.seqs[s]
	if sq.cells > 0 && !C.memgen_llama_seq_rm(c.c, C.llama_seq_id(s), 0) {
		return 0, fmt.Errorf("%w: llama_memory_seq_rm refused sequence %d", ErrDecode, s)
	}
	sq.cells = 0
	var freed memapi.Bytes
	var errs []error
	for i, t := range c.tensors {
		if sq.moved != nil && sq.moved[i] != nil {
			if err := sq.moved[i].Discard(); err != nil && !errors.Is(err, memapi.ErrReleased) {
				errs = append(errs, err)
			}
			sq.moved[i] = nil
			freed += t.backed[s]
			errs = append(errs, t.forget(s))
			continue
		}
		n := t.backed[s]
		if err := t.resize(ctx, s, 0); err != nil {
			errs = append(errs, fmt.Errorf("%s of sequence %d: %w", t.name, s, err))
			continue
		}
		freed += n
	}
	sq.moved = nil
	return freed, errors.Join(errs...)
}

// forget records that stream s of the tensor holds nothing after its host
// copy was discarded: its range is a hole already. With one stream the
// region's length is taken back to 0 as well, so that the next Grow backs
// the rows again.
func (t *kvTensor) forget(s int) error {
	t.backed[s] = 0
	if len(t.backed) == 1 {
		return t.region.Shrink(context.Background(), 0, nil)
	}
	return nil
}

// makeRoom is the reservation a DecodeBatch makes, before it restores or
// grows anything, for the bytes it will commit (c.mu held, no region
// transaction open): when they are short, the governor asks the holders,
// this context's among them, whose Reclaim may then give up the
// sequences the call does not name (in this goroutine: a ticket handed to
// a region's own commit would find the context locked and the region in
// a transaction). The grant is cancelled at once; the restores and the
// growth reserve their own.
func (c *Context) makeRoom(ctx context.Context, need memapi.Bytes, named map[int]bool, rows map[int]int) error {
	d := &decoding{c: c, named: named, active: true}
	g, err := c.m.opts.Governor.Reserve(context.WithValue(ctx, decodingKey{}, d), governor.Request{Authority: c.authority(), Holder: c.holder, Role: "kv", Bytes: need})
	d.active = false
	if err != nil {
		return c.growError(ctx, rows, err)
	}
	return g.Cancel()
}

// roomNeeded is what a call's restores and growth commit (rows: per
// sequence, the rows it touches), when a sequence it does not name could
// be given up for it; 0 otherwise.
func (c *Context) roomNeeded(named map[int]bool, rows map[int]int) memapi.Bytes {
	if len(c.victims(named)) == 0 {
		return 0
	}
	var n memapi.Bytes
	for s := range named {
		for _, o := range c.seqs[s].moved {
			if o != nil {
				n += o.Bytes()
			}
		}
	}
	for _, t := range c.tensors {
		for s, r := range rows {
			want, _ := memapi.RoundUp(memapi.Bytes(r-rowsShort)*t.rowBytes, t.region.Granularity())
			if want > t.backed[s] {
				n += want - t.backed[s]
			}
		}
	}
	return n
}
