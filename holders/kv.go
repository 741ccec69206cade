package holders

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pmm"
)

// KVConfig configures a KVStore.
type KVConfig struct {
	// Manager and Device say where the KV cache lives. The device's
	// mechanism must offer VirtualBacking (and SharedMapping for prefixes).
	Manager *pmm.Manager
	Device  memapi.DeviceKey
	// Holder is the store's holder name in the governor (register the store
	// under the same name); default "kv". Role defaults to "kv".
	Holder, Role string
	// Priority is carried by the store's reservations.
	Priority int
	// Shape sizes a token's KV.
	Shape ModelShape
	// Context is the device context used to fill prefixes from bytes
	// (NewPrefix with data); optional otherwise.
	Context memapi.DeviceContext
	// OnPreempt, when set, is told of every preempted request, without the
	// store's lock: from Reclaim (in the goroutine of the reservation that
	// asked for memory) for an idle request, from the request's own Append
	// for a busy one. It must not block on the store;
	// queueing the request for Resume is what it is for.
	OnPreempt func(*Request)
}

// KVStore is the reference KV page store: one growable region per request,
// shared read-only prefixes with explicit copy-on-write, and preemption
// under pressure. It implements governor.Holder. It is safe for concurrent
// use; calls on one Request are expected from one goroutine at a time.
type KVStore struct {
	cfg       KVConfig
	bind      *pmm.Binding
	authority memapi.AuthorityID
	bpt       memapi.Bytes

	mu       sync.Mutex
	seq      uint64 // logical clock of uses
	live     map[*Request]struct{}
	requeue  []*Request
	prefixes map[*Prefix]struct{}
	closed   bool
	stats    KVStats
}

// KVStats are a KVStore's figures.
type KVStats struct {
	Running  int          // requests holding memory
	Requeued int          // preempted requests waiting on the requeue list
	Tokens   int          // tokens backed in running requests (prefix excluded)
	Bytes    memapi.Bytes // private bytes of running requests (shared prefixes excluded)
	Prefixes int          // open prefixes

	Admitted     uint64       // successful Admit calls
	Finished     uint64       // requests finished
	Preempted    uint64       // preemptions
	Resumed      uint64       // successful Resume calls
	CopyOnWrites uint64       // prefixes copied on write
	Tickets      uint64       // pressure tickets answered
	Reclaimed    memapi.Bytes // bytes reported freed to tickets
}

// NewKVStore binds a KV store to a device. Register it with the governor
// under cfg.Holder so that it receives pressure tickets.
func NewKVStore(cfg KVConfig) (*KVStore, error) {
	const op = "holders.NewKVStore"
	if cfg.Manager == nil {
		return nil, memapi.Errorf(op, memapi.ErrNilHandle, "no manager")
	}
	if err := cfg.Shape.Validate(); err != nil {
		return nil, err
	}
	if cfg.Holder == "" {
		cfg.Holder = "kv"
	}
	if cfg.Role == "" {
		cfg.Role = "kv"
	}
	mech, err := cfg.Manager.Mechanism(cfg.Device)
	if err != nil {
		return nil, err
	}
	if _, err := memapi.RequireVirtualBacking(mech); err != nil {
		return nil, err
	}
	bind, err := cfg.Manager.Bind(cfg.Holder, cfg.Role, cfg.Device, pmm.WithPriority(cfg.Priority))
	if err != nil {
		return nil, err
	}
	return &KVStore{
		cfg:       cfg,
		bind:      bind,
		authority: mech.Info().Authority,
		bpt:       cfg.Shape.BytesPerToken(),
		live:      map[*Request]struct{}{},
		prefixes:  map[*Prefix]struct{}{},
	}, nil
}

// RequestSpec describes a request to admit. Token counts exclude the shared
// prefix.
type RequestSpec struct {
	ID           string
	PromptTokens int     // tokens backed at admission (may be 0)
	MaxTokens    int     // the most tokens the request may hold: its reserved context
	Priority     int     // higher is kept longer under pressure
	Prefix       *Prefix // optional shared system prompt, mapped read-only first
}

// Admit reserves the request's maximum context, maps its prefix read-only
// and backs its prompt. It waits (bounded by ctx) for the governor to grant
// the prompt's bytes; on any failure nothing of the request remains.
func (s *KVStore) Admit(ctx context.Context, spec RequestSpec) (*Request, error) {
	const op = "holders.KVStore.Admit"
	if spec.MaxTokens <= 0 || spec.PromptTokens < 0 || spec.PromptTokens > spec.MaxTokens {
		return nil, &memapi.Error{Op: op, Kind: memapi.ErrInvalidSize, Wanted: memapi.Bytes(max(spec.PromptTokens, 0)),
			Available: memapi.Bytes(max(spec.MaxTokens, 0)), Detail: "need 0 <= prompt tokens <= max tokens, max tokens > 0 (request " + spec.ID + ")"}
	}
	if spec.Prefix != nil && spec.Prefix.store != s {
		return nil, memapi.Errorf(op, memapi.ErrForeignHandle, "prefix of another store")
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, memapi.Errorf(op, memapi.ErrClosed, "KV store is closed")
	}
	s.mu.Unlock()
	r := &Request{s: s, spec: spec}
	actx := context.WithValue(ctx, askerKey{s}, &asker{admitting: true, priority: spec.Priority})
	region, base, err := s.start(actx, spec, spec.PromptTokens)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.Join(memapi.Errorf(op, memapi.ErrClosed, "KV store closed during admission"), region.Close())
	}
	s.seq++
	r.admitted, r.lastUse = s.seq, s.seq
	r.region, r.base, r.shared, r.tokens, r.state = region, base, spec.Prefix != nil, spec.PromptTokens, Running
	s.live[r] = struct{}{}
	s.stats.Admitted++
	return r, nil
}

// start builds a request's region holding tokens: reserve, map the prefix,
// grow. It touches no store state, so Reclaim never waits for it.
func (s *KVStore) start(ctx context.Context, spec RequestSpec, tokens int) (*pmm.Region, memapi.Bytes, error) {
	var base memapi.Bytes
	if spec.Prefix != nil {
		base = spec.Prefix.shared.Size()
	}
	region, err := s.bind.ReserveVirtual(ctx, base+memapi.Bytes(spec.MaxTokens)*s.bpt)
	if err != nil {
		return nil, 0, err
	}
	if spec.Prefix != nil {
		rng, err := region.MapShared(ctx, spec.Prefix.shared, memapi.AccessReadOnly)
		if err != nil {
			return nil, 0, errors.Join(err, region.Close())
		}
		base = rng.Len
	}
	if tokens > 0 {
		if err := region.Grow(ctx, base+memapi.Bytes(tokens)*s.bpt, nil); err != nil {
			return nil, 0, errors.Join(err, region.Close())
		}
	}
	return region, base, nil
}

// Resume admits a preempted request again: a new region holding the tokens
// it had (their KV is to be recomputed), its prefix mapped read-only. On
// success it leaves the requeue list; on failure it stays there, unchanged.
func (s *KVStore) Resume(ctx context.Context, r *Request) error {
	const op = "holders.KVStore.Resume"
	if r == nil || r.s != s {
		return memapi.Errorf(op, memapi.ErrForeignHandle, "request of another store")
	}
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return memapi.Errorf(op, memapi.ErrClosed, "KV store is closed")
	case r.state != Preempted:
		s.mu.Unlock()
		return memapi.Errorf(op, memapi.ErrInUse, "request %s is %v, not preempted", r.spec.ID, r.state)
	case r.busy:
		s.mu.Unlock()
		return memapi.Errorf(op, memapi.ErrInUse, "request %s is being resumed", r.spec.ID)
	}
	r.busy = true
	tokens := r.tokens
	s.mu.Unlock()

	actx := context.WithValue(ctx, askerKey{s}, &asker{r: r, admitting: true, priority: r.spec.Priority})
	region, base, err := s.start(actx, r.spec, tokens)

	s.mu.Lock()
	defer s.mu.Unlock()
	r.busy = false
	if err != nil {
		return err
	}
	if s.closed || r.state != Preempted {
		return errors.Join(memapi.Errorf(op, memapi.ErrClosed, "request %s was closed during resume", r.spec.ID), region.Close())
	}
	s.seq++
	r.lastUse = s.seq
	r.region, r.base, r.shared, r.state = region, base, r.spec.Prefix != nil, Running
	s.requeue = slices.DeleteFunc(s.requeue, func(q *Request) bool { return q == r })
	s.live[r] = struct{}{}
	s.stats.Resumed++
	return nil
}

// Stats returns the store's figures.
func (s *KVStore) Stats() KVStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Running, st.Requeued, st.Prefixes = len(s.live), len(s.requeue), len(s.prefixes)
	for r := range s.live {
		st.Tokens += r.tokens
		st.Bytes += r.privateBytesLocked()
	}
	return st
}

// Reclaim answers a pressure ticket by preempting requests, and may free 0.
//
// A request whose step is in flight (a recorded fence not complete) is never
// preempted, nor is the request whose own growth asked (it waits, bounded
// by its context, and other requests' tickets may preempt it meanwhile:
// two requests waiting on each other's memory never wait forever). The
// others are chosen lowest priority first, then idle before
// busy, then idle longest, then newest (the least work lost), until the
// ticket's bytes are covered. An idle request is preempted at once: its
// region is closed and the request requeued. A busy request (its own Append
// waiting for memory) is preempted by cancelling its wait; its call then
// closes the region and fails, the request Preempted. When
// the ticket comes from an admission (Admit or Resume) only requests of a
// lower priority than the admitted one are preempted: admitting never evicts
// its equals. It reports the private bytes of the preempted requests, which
// the governor sees pending once the regions are closed and refunded when
// the queue has freed them.
func (s *KVStore) Reclaim(ctx context.Context, t governor.Ticket) (memapi.Bytes, error) {
	if t.Authority != s.authority || t.Wanted == 0 {
		s.count(0)
		return 0, nil
	}
	a, _ := ctx.Value(askerKey{s}).(*asker)
	type victim struct {
		r      *Request
		region *pmm.Region
		bytes  memapi.Bytes
	}
	s.mu.Lock()
	if a != nil && a.r != nil && a.r.doomed {
		s.mu.Unlock() // the asker is being preempted: its wait ends anyway
		s.count(0)
		return 0, nil
	}
	var cands []*Request
	for r := range s.live {
		if r.doomed || r.inFlightLocked() || (a != nil && (a.r == r || a.admitting && r.spec.Priority >= a.priority)) {
			continue
		}
		cands = append(cands, r)
	}
	slices.SortFunc(cands, func(x, y *Request) int {
		return cmp.Or(
			cmp.Compare(x.spec.Priority, y.spec.Priority),
			compareBool(x.busy, y.busy), // idle first
			cmp.Compare(x.lastUse, y.lastUse),
			cmp.Compare(y.admitted, x.admitted), // newest first
		)
	})
	var idle []victim
	var cancels []context.CancelCauseFunc
	var freed memapi.Bytes
	for _, r := range cands {
		if freed >= t.Wanted {
			break
		}
		n := r.privateBytesLocked()
		if n == 0 {
			continue // nothing of its own to free
		}
		freed += n
		if r.busy {
			r.doomed = true
			cancels = append(cancels, r.cancel)
			continue
		}
		idle = append(idle, victim{r, r.region, n})
		s.preemptLocked(r)
	}
	s.mu.Unlock()

	for _, cancel := range cancels {
		if cancel != nil { // nil: the call does not wait; exit preempts it
			cancel(errPreempted)
		}
	}
	var errs []error
	for _, v := range idle {
		if err := v.region.Close(); err != nil {
			// Close ends the region whatever it returns (pmm's one
			// lifecycle: an error means its release could not be queued
			// and its bytes stay charged, quarantined and visible, until a
			// retry frees them). So the request stays preempted, but those
			// bytes are not freed for this ticket.
			freed -= v.bytes
			errs = append(errs, err)
		}
		if s.cfg.OnPreempt != nil {
			s.cfg.OnPreempt(v.r)
		}
	}
	s.count(freed)
	return freed, errors.Join(errs...)
}

func compareBool(x, y bool) int {
	switch {
	case x == y:
		return 0
	case !x:
		return -1
	}
	return 1
}

func (s *KVStore) count(freed memapi.Bytes) {
	s.mu.Lock()
	s.stats.Tickets++
	s.stats.Reclaimed += freed
	s.mu.Unlock()
}

func (s *KVStore) preemptLocked(r *Request) {
	delete(s.live, r)
	r.state = Preempted
	r.region = nil
	r.preemptions++
	s.requeue = append(s.requeue, r)
	s.stats.Preempted++
}

func (s *KVStore) unpreemptLocked(r *Request, region *pmm.Region) {
	s.requeue = slices.DeleteFunc(s.requeue, func(q *Request) bool { return q == r })
	r.state, r.region = Running, region
	r.preemptions--
	s.stats.Preempted--
	s.live[r] = struct{}{}
}

// Close finishes every request (running or requeued), closes every prefix
// still open and ends the store's binding. It fails with memapi.ErrInUse,
// changing nothing, while a store call is in progress. The memory is freed
// behind recorded fences by the device context's queue.
func (s *KVStore) Close() error {
	const op = "holders.KVStore.Close"
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	for r := range s.live {
		if r.busy {
			s.mu.Unlock()
			return memapi.Errorf(op, memapi.ErrInUse, "request %s is inside a store call", r.spec.ID)
		}
	}
	for _, r := range s.requeue {
		if r.busy {
			s.mu.Unlock()
			return memapi.Errorf(op, memapi.ErrInUse, "request %s is being resumed", r.spec.ID)
		}
	}
	s.closed = true
	var regions []*pmm.Region
	for r := range s.live {
		regions = append(regions, r.region)
		r.state, r.region = Finished, nil
		s.stats.Finished++
	}
	for _, r := range s.requeue {
		r.state = Finished
		s.stats.Finished++
	}
	clear(s.live)
	s.requeue = nil
	prefixes := make([]*Prefix, 0, len(s.prefixes))
	for p := range s.prefixes {
		prefixes = append(prefixes, p)
	}
	s.mu.Unlock()
	var errs []error
	for _, rg := range regions {
		errs = append(errs, rg.Close())
	}
	for _, p := range prefixes {
		errs = append(errs, p.Close())
	}
	errs = append(errs, s.bind.Close())
	return errors.Join(errs...)
}
