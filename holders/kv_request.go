package holders

import (
	"context"
	"errors"
	"fmt"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// RequestState is where a request is in its life.
type RequestState uint8

const (
	// Running: the request holds its region.
	Running RequestState = iota + 1
	// Preempted: its memory was freed under pressure; it waits on the
	// requeue list for Resume (or Finish).
	Preempted
	// Finished: it ended; nothing of it remains.
	Finished
)

func (s RequestState) String() string {
	switch s {
	case Running:
		return "running"
	case Preempted:
		return "preempted"
	case Finished:
		return "finished"
	}
	return fmt.Sprintf("RequestState(%d)", uint8(s))
}

// Request is one request's KV cache: a region laid out as the shared prefix
// (if any) followed by the request's own tokens, grown as tokens are
// appended. After a preemption its methods fail (its State is Preempted)
// until KVStore.Resume admits it again.
type Request struct {
	s        *KVStore
	spec     RequestSpec
	admitted uint64

	// Guarded by s.mu.
	state       RequestState
	region      *pmm.Region
	base        memapi.Bytes            // bytes the prefix view occupies at the start
	shared      bool                    // the prefix view is still the shared backing
	tokens      int                     // own tokens backed
	busy        bool                    // a store call is in progress on the request
	cancel      context.CancelCauseFunc // cancels the call's pmm waits (while busy)
	doomed      bool                    // Reclaim chose it while busy: exit preempts it
	lastUse     uint64
	preemptions int
}

// Spec returns what the request was admitted with.
func (r *Request) Spec() RequestSpec { return r.spec }

// State returns the request's state.
func (r *Request) State() RequestState {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.state
}

// Tokens returns the request's own tokens backed (prefix excluded). After a
// preemption it is the count Resume backs again.
func (r *Request) Tokens() int {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.tokens
}

// Shared reports whether the request still maps its prefix shared
// (read-only): false without a prefix or after a copy-on-write.
func (r *Request) Shared() bool {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.shared
}

// TokenAddr returns the device address of sequence position i while the
// request runs, else 0. The region is laid out as the prefix's chunks, then
// the request's own tokens: positions below the prefix's token count are
// in the prefix, the others follow its chunks. Position 0 is the region's
// start, which does not move as the request grows (a resumed request has a
// new one).
func (r *Request) TokenAddr(i int) memapi.DeviceAddr {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.region == nil {
		return 0
	}
	return r.region.Addr() + memapi.DeviceAddr(r.tokenOffset(i))
}

// tokenOffset returns the offset in the region of sequence position i.
func (r *Request) tokenOffset(i int) memapi.Bytes {
	bpt := r.s.bpt
	if p := r.spec.Prefix; p != nil {
		if i < p.tokens {
			return memapi.Bytes(i) * bpt
		}
		return p.shared.Size() + memapi.Bytes(i-p.tokens)*bpt
	}
	return memapi.Bytes(i) * bpt
}

func (r *Request) privateBytesLocked() memapi.Bytes {
	if r.region == nil {
		return 0
	}
	n := r.region.Len()
	if r.shared {
		n -= r.base
	}
	return n
}

func (r *Request) inFlightLocked() bool {
	return r.region != nil && len(r.region.Pending()) > 0
}

// asker tags the context of a store call, so that Reclaim, called by the
// governor with that context, knows which request (or admission) asks.
type asker struct {
	r         *Request
	admitting bool // Admit or Resume: preempt only lower priorities
	priority  int
}

type askerKey struct{ s *KVStore }

// enter marks the request busy for a store call; Reclaim may then choose
// it only by cancelling the context its pmm waits run with (waitable), and
// exit preempts it when the call ends. exit returns an errPreempted error
// wrapping the call's own when that happened.
func (r *Request) enter(op string) (*pmm.Region, error) {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := r.runningLocked(op); err != nil {
		return nil, err
	}
	if r.busy {
		return nil, memapi.Errorf(op, memapi.ErrInUse, "request %s is inside another store call", r.spec.ID)
	}
	r.busy = true
	return r.region, nil
}

// waitable returns the context for a pmm call that may wait for the
// governor: tagged with the request (so its own ticket skips it) and
// cancellable by Reclaim. It is made only for calls that reserve, which
// keeps the common decode step (no new chunk) free of it.
func (r *Request) waitable(ctx context.Context) context.Context {
	s := r.s
	ctx, cancel := context.WithCancelCause(ctx)
	s.mu.Lock()
	r.cancel = cancel
	doomed := r.doomed
	s.mu.Unlock()
	if doomed {
		cancel(errPreempted)
	}
	return context.WithValue(ctx, askerKey{s}, &asker{r: r})
}

func (r *Request) exit(op string, err error) error {
	s := r.s
	s.mu.Lock()
	cancel := r.cancel
	r.busy, r.cancel = false, nil
	s.seq++
	r.lastUse = s.seq
	doomed := r.doomed
	region := r.region
	if doomed {
		r.doomed = false
		s.preemptLocked(r)
	}
	s.mu.Unlock()
	if cancel != nil {
		cancel(nil)
	}
	if !doomed {
		return err
	}
	if cerr := region.Close(); cerr != nil {
		s.mu.Lock()
		s.unpreemptLocked(r, region)
		s.mu.Unlock()
		return errors.Join(err, cerr)
	}
	if s.cfg.OnPreempt != nil {
		s.cfg.OnPreempt(r)
	}
	return &memapi.Error{Op: op, Kind: errPreempted, Detail: "request " + r.spec.ID + " was preempted during the call", Err: err}
}

func (r *Request) runningLocked(op string) error {
	switch r.state {
	case Running:
		return nil
	case Preempted:
		return &memapi.Error{Op: op, Kind: errPreempted, Detail: "request " + r.spec.ID}
	default:
		return memapi.Errorf(op, memapi.ErrClosed, "request %s is finished", r.spec.ID)
	}
}

// Append backs n more tokens (a decode step appends 1). The region grows
// only when the tokens cross into a new granularity chunk; then it waits,
// bounded by ctx, for the governor's grant. On failure the request is as
// before. Appending past MaxTokens is ErrInvalidRange.
func (r *Request) Append(ctx context.Context, n int) error {
	const op = "holders.Request.Append"
	if n <= 0 {
		return &memapi.Error{Op: op, Kind: memapi.ErrInvalidSize, Detail: fmt.Sprintf("append %d tokens", n)}
	}
	region, err := r.enter(op)
	if err != nil {
		return err
	}
	return r.exit(op, r.append(ctx, region, n))
}

func (r *Request) append(ctx context.Context, region *pmm.Region, n int) error {
	const op = "holders.Request.Append"
	s := r.s
	s.mu.Lock()
	prev, base := r.tokens, r.base
	s.mu.Unlock()
	want := prev + n
	if want > r.spec.MaxTokens {
		return &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: memapi.Bytes(want), Available: memapi.Bytes(r.spec.MaxTokens),
			Detail: "tokens beyond the request's maximum context (request " + r.spec.ID + ")"}
	}
	target := base + memapi.Bytes(want)*s.bpt
	if target > region.Len() { // a new chunk: the grant may wait
		ctx = r.waitable(ctx)
	}
	return region.Grow(ctx, target, func(newLen memapi.Bytes) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if newLen == target {
			r.tokens = want
		} else { // rollback
			r.tokens = prev
		}
		return nil
	})
}

// RecordUse records the fence of a step that uses the request's KV. Until
// it completes the request is in flight: never preempted, and its memory is
// freed only after it, whatever happens.
func (r *Request) RecordUse(f memapi.Fence) error {
	const op = "holders.Request.RecordUse"
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if err := r.runningLocked(op); err != nil {
		return err
	}
	r.s.seq++
	r.lastUse = r.s.seq
	return r.region.RecordUse(f)
}

// prepareWrite makes bytes [off, off+n) of the region writable before the
// request writes them. When they touch the shared prefix it copies the
// prefix on write: a private copy, charged to the store, replaces the
// read-only view at the same addresses; the other requests keep the shared
// one. It fails with memapi.ErrInUse while a step is in flight (the copy
// must not race device work) and with memapi.ErrInvalidRange for bytes not
// backed. On failure the request keeps its shared view.
func (r *Request) prepareWrite(ctx context.Context, off, n memapi.Bytes) error {
	const op = "holders.Request.PrepareWrite"
	region, err := r.enter(op)
	if err != nil {
		return err
	}
	return r.exit(op, r.copyOnWrite(ctx, region, off, n))
}

func (r *Request) copyOnWrite(ctx context.Context, region *pmm.Region, off, n memapi.Bytes) error {
	const op = "holders.Request.PrepareWrite"
	s := r.s
	s.mu.Lock()
	shared, base, inFlight := r.shared, r.base, r.inFlightLocked()
	s.mu.Unlock()
	if n == 0 || off+n < off || off+n > region.Len() {
		return &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: off + n, Available: region.Len(), Detail: "bytes not backed (request " + r.spec.ID + ")"}
	}
	if !shared || off >= base {
		return nil
	}
	if inFlight {
		return memapi.Errorf(op, memapi.ErrInUse, "request %s has a step in flight", r.spec.ID)
	}
	if err := region.CopyOnWrite(r.waitable(ctx), 0); err != nil {
		return err
	}
	s.mu.Lock()
	r.shared = false
	s.stats.CopyOnWrites++
	s.mu.Unlock()
	return nil
}

// preempt is the runtime's own preemption: the request's region is released
// behind its recorded fences, the request is requeued (and OnPreempt told),
// to be resumed or finished later. It fails with memapi.ErrInUse while a
// store call on the request is in progress, and with errPreempted or
// memapi.ErrClosed when it does not run.
func (r *Request) preempt() error {
	const op = "holders.Request.Preempt"
	s := r.s
	s.mu.Lock()
	if err := r.runningLocked(op); err != nil {
		s.mu.Unlock()
		return err
	}
	if r.busy {
		s.mu.Unlock()
		return memapi.Errorf(op, memapi.ErrInUse, "request %s is inside a store call", r.spec.ID)
	}
	region := r.region
	s.preemptLocked(r)
	s.mu.Unlock()
	if err := region.Close(); err != nil {
		s.mu.Lock()
		s.unpreemptLocked(r, region)
		s.mu.Unlock()
		return err
	}
	if s.cfg.OnPreempt != nil {
		s.cfg.OnPreempt(r)
	}
	return nil
}

// Finish ends the request: its region is released behind its recorded
// fences. A preempted request leaves the requeue list. It fails with
// memapi.ErrInUse while a store call on it is in progress; after the first
// success it returns nil.
func (r *Request) Finish() error {
	const op = "holders.Request.Finish"
	s := r.s
	s.mu.Lock()
	switch {
	case r.state == Finished:
		s.mu.Unlock()
		return nil
	case r.busy:
		s.mu.Unlock()
		return memapi.Errorf(op, memapi.ErrInUse, "request %s is inside a store call", r.spec.ID)
	}
	region := r.region
	if r.state == Preempted {
		s.requeue = deleteRequest(s.requeue, r)
	} else {
		delete(s.live, r)
	}
	r.state, r.region = Finished, nil
	s.stats.Finished++
	s.mu.Unlock()
	if region == nil {
		return nil
	}
	if err := region.Close(); err != nil {
		s.mu.Lock()
		r.state, r.region = Running, region
		s.live[r] = struct{}{}
		s.stats.Finished--
		s.mu.Unlock()
		return err
	}
	return nil
}

func deleteRequest(list []*Request, r *Request) []*Request {
	for i, q := range list {
		if q == r {
			return append(list[:i:i], list[i+1:]...)
		}
	}
	return list
}
