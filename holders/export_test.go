package holders

import (
	"context"
	"slices"

	"github.com/memgen/memgen/generated/memapi"
)

// What the tests (package holders_test) reach that callers do not.

var ErrPreempted = errPreempted

func (s *KVStore) Holder() string                  { return s.cfg.Holder }
func (s *KVStore) Authority() memapi.AuthorityID   { return s.authority }
func (s *KVStore) BytesPerToken() memapi.Bytes     { return s.bpt }
func (r *Residency) Holder() string                { return r.cfg.Holder }
func (r *Residency) Authority() memapi.AuthorityID { return r.devAuth }

// Requeued returns the preempted requests waiting to be resumed (or
// finished), oldest preemption first.
func (s *KVStore) Requeued() []*Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requeue)
}

func (p *Prefix) Tokens() int { return p.tokens }

// Views returns how many regions map the prefix now (the short-lived view
// that wrote it counts until the device context's queue has released it).
func (p *Prefix) Views() int { return p.shared.Views() }

func (u *WeightUse) Size() memapi.Bytes { return u.w.size }

func (r *Request) ID() string { return r.spec.ID }

// Addr returns the region's base address while the request runs, else 0.
func (r *Request) Addr() memapi.DeviceAddr { return r.TokenAddr(0) }

// TokenOffset returns the offset in the region of sequence position i.
func (r *Request) TokenOffset(i int) memapi.Bytes { return r.tokenOffset(i) }

func (r *Request) Preemptions() int {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.preemptions
}

// Len returns the bytes backed from the region's start (prefix included,
// rounded to the granularity), or 0 when the request does not run.
func (r *Request) Len() memapi.Bytes {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.region == nil {
		return 0
	}
	return r.region.Len()
}

// Bytes returns the request's private bytes charged: its own tokens' chunks,
// plus its copy of the prefix after a copy-on-write.
func (r *Request) Bytes() memapi.Bytes {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.privateBytesLocked()
}

// InFlight reports whether a recorded step has not completed yet.
func (r *Request) InFlight() bool {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.inFlightLocked()
}

func (r *Request) PrepareWrite(ctx context.Context, off, n memapi.Bytes) error {
	return r.prepareWrite(ctx, off, n)
}
func (r *Request) Preempt() error                       { return r.preempt() }
func (r *Residency) Pin(name string, pinned bool) error { return r.pin(name, pinned) }
func (r *Residency) Unload(name string) error           { return r.unload(name) }
func (s ModelShape) String() string                     { return s.describe() }
