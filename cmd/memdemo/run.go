package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/holders"
	"github.com/memgen/memgen/internal/procmem"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/memreport"
	"github.com/memgen/memgen/pool"
)

// waitLimit bounds, in wall-clock time, one wait of the run loop on the
// governor or the device. Nothing should come near it: a wait that reaches
// it is reported as a failure of the run.
const waitLimit = 30 * time.Second

// tokenStamp is how many bytes of each new token's KV the decode step
// writes through the device stream (and the audits read back): enough to
// prove the token's memory is backed and private, without spending the
// demo's time on memmove.
const tokenStamp = 256

// active is a request admitted at least once and not finished.
type active struct {
	req       Request
	r         *holders.Request
	left      int // tokens still to generate
	preempted bool
	pattern   []byte    // the stamp written at the start of each of its tokens' KV
	admitted  time.Time // simulated time of its first admission
}

// Outcome is what a run measured: the figures compared with the static
// baseline, the memory system's counters and the results of the audits.
type Outcome struct {
	Figures
	TraceName string
	Mechanism string
	Capacity  memapi.Bytes

	Preemptions, Resumed uint64
	PreemptedRequests    int // distinct requests preempted at least once
	Stalls               int // decode steps a request could not grow in
	PeakCharged          memapi.Bytes
	PeakInUse            memapi.Bytes // reserved + charged + pending
	PressureEvents       uint64
	Tickets              uint64
	Reclaimed            memapi.Bytes
	Offloads, Reloads    uint64
	DeferredFrees        uint64
	CopyOnWrites         uint64

	// The activation workspace (--workspace): the pool's figures as the
	// work ended and after Close, and the pressure rounds on the device.
	Pool         pool.Stats
	PoolAfter    pool.Stats
	PoolLargest  memapi.Bytes // the largest step's activations as the pool rounds them
	PoolLatency  latencies    // the wall time of the pool's Allocs
	PoolSteps    uint64
	PoolAudits   int
	PoolPressure pressureFigures

	Checks, Failures int      // ledger identity checks and their failures
	FailureLog       []string // the first failures
	KernelChecks     int      // full audits comparing governor, mechanism and kernel
	KernelAtPeak     memapi.Bytes
	UsedAtPeak       memapi.Bytes
	KernelBeforeEnd  memapi.Bytes // last full audit with the weights still loaded
	UsedBeforeEnd    memapi.Bytes
	KernelAfter      memapi.Bytes // after everything was closed
	UsedAfter        memapi.Bytes
	FreeAfter        []memapi.Bytes // per authority, must equal the capacities
	CapacitiesAfter  []memapi.Bytes
	Leaks            uint64 // owning handles garbage collected without Close
	DataChecks       int    // read-backs of KV, prefix and weight bytes
	Wall             time.Duration
	HasKernel        bool
	GoroutinesBefore int
	GoroutinesAfter  int
	RSSBefore        memapi.Bytes // process resident memory before the memory system was built
	RSSPeak          memapi.Bytes // its high-water mark
	RSSAfter         memapi.Bytes // after everything was closed and the Go heap returned
}

// engine replays a trace on a stack.
type engine struct {
	cfg   Config
	s     *stack
	reqs  []Request
	out   *Outcome
	log   *slog.Logger
	prog  *progress
	bpt   memapi.Bytes
	gran  memapi.Bytes
	token [][]byte // per-request token patterns, by ID mod len

	now       time.Duration // simulated time since the first arrival
	running   []*active
	byReq     map[*holders.Request]*active
	preempted map[*active]struct{}
	everPre   map[int]struct{}
	fence     memapi.Fence
	stream    memapi.Stream
	secondDue time.Duration

	// finished are the requests the last decode step finished: their
	// spans end when the step's time has passed.
	finished []*active
	// stepStates is the token-state bytes of the last decode step: the
	// tokens of the requests that ran it and the shared prefix once.
	stepStates memapi.Bytes
}

// runHooks are what a run reports to: the memory report, the progress
// display, the log and the metrics source (each optional).
type runHooks struct {
	rec     *memreport.Recorder
	prog    *progress
	log     *slog.Logger
	metrics *lateSource
}

// Run replays the trace against the memory system and returns what it
// measured. An error means the run could not start or stop cleanly; a run
// whose audits failed returns with Outcome.Failures > 0.
func Run(ctx context.Context, cfg Config, reqs []Request, traceName string, h runHooks) (*Outcome, error) {
	rec, prog, log := h.rec, h.prog, h.log
	if rec == nil {
		rec = memreport.New(memreport.Options{})
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	out := &Outcome{TraceName: traceName, Mechanism: cfg.Mechanism, Capacity: cfg.Budget, GoroutinesBefore: runtime.NumGoroutine()}
	out.Requests = len(reqs)
	leaks0 := ep.Leaks()
	out.RSSBefore, _ = procMemory()
	start := time.Now()
	s, err := newStack(ctx, cfg, rec, log)
	if err != nil {
		return nil, err
	}
	if h.metrics != nil {
		h.metrics.set(s.g)
	}
	e := &engine{cfg: cfg, s: s, reqs: reqs, out: out, log: log, prog: prog,
		bpt: cfg.Shape.BytesPerToken(), byReq: map[*holders.Request]*active{}, preempted: map[*active]struct{}{}, everPre: map[int]struct{}{},
		secondDue: cfg.SecondEvery}
	e.gran = s.mgrGranularity()
	out.HasKernel = s.devCPU != nil
	s.onPreempt = e.onPreempt
	for i := range 64 {
		e.token = append(e.token, pattern("token"+strconv.Itoa(i), int(min(e.bpt, tokenStamp))))
	}
	runErr := e.loop(ctx)
	// An interrupted run still tears down cleanly: requests in flight are
	// finished and every byte is checked back.
	closeErr := e.finish(context.WithoutCancel(ctx))
	out.Wall = time.Since(start)
	// A handle dropped without Close is found by the garbage collector.
	runtime.GC()
	runtime.GC()
	out.Leaks = ep.Leaks() - leaks0
	out.GoroutinesAfter = runtime.NumGoroutine()
	debug.FreeOSMemory()
	out.RSSAfter, out.RSSPeak = procMemory()
	if n := s.queueErrs.count(); n > 0 {
		out.Failures += n
		out.FailureLog = append(out.FailureLog, s.queueErrs.first...)
	}
	return out, errors.Join(runErr, closeErr)
}

func (s *stack) mgrGranularity() memapi.Bytes {
	m, err := s.mgr.Mechanism(s.devKey)
	if err != nil {
		return 1
	}
	return m.Info().Granularity
}

func (e *engine) fail(format string, args ...any) {
	e.out.Failures++
	if len(e.out.FailureLog) < 20 {
		e.out.FailureLog = append(e.out.FailureLog, fmt.Sprintf("t=%.3fs: ", e.now.Seconds())+fmt.Sprintf(format, args...))
	}
}

func (e *engine) onPreempt(r *holders.Request) {
	a := e.byReq[r]
	if a == nil {
		e.fail("preempted request %s is not one of the run's", r.Spec().ID)
		return
	}
	a.preempted = true
	e.s.rec.Annotate(memreport.Annotation{Time: e.s.clock.Now(), Authority: e.s.devAuth, Kind: "preemption", Holder: holderKV,
		Bytes: memapi.Bytes(r.Tokens()) * e.bpt, Detail: fmt.Sprintf("request %d, %d tokens to recompute", a.req.ID, r.Tokens())})
	e.preempted[a] = struct{}{}
	e.everPre[a.req.ID] = struct{}{}
	e.out.Preemptions++
}

// own returns the tokens of a request that are its own (not in the shared
// prefix) and whether it maps the prefix.
func (e *engine) own(q Request) (prompt, maxTokens int, prefix *holders.Prefix) {
	if e.s.prefix != nil && q.Prompt >= e.cfg.PrefixTokens {
		return q.Prompt - e.cfg.PrefixTokens, q.Context() - e.cfg.PrefixTokens, e.s.prefix
	}
	return q.Prompt, q.Context(), nil
}

func (e *engine) roundUp(n memapi.Bytes) memapi.Bytes { return (n + e.gran - 1) / e.gran * e.gran }

// watermark is the room admission leaves for the running requests to grow
// into: one chunk for the new request plus Config.Watermark, so that the
// next steps' growth rarely has to preempt.
func (e *engine) watermark() memapi.Bytes { return e.gran + e.cfg.Watermark }

// room returns the device bytes free or on their way back (pending). The
// activation pool's cache is not counted: an admission that took it would
// only make the next step grow the pool back at the KV store's expense
// (the governor still takes it first when a reservation is short).
func (e *engine) room() memapi.Bytes {
	a, _ := e.s.g.Authority(e.s.devAuth)
	return a.Free + a.Pending
}

func (e *engine) loop(ctx context.Context) error {
	st, err := e.s.devDC.NewStream()
	if err != nil {
		return err
	}
	e.stream = st
	var kvRoom memapi.Bytes
	if e.s.prefix != nil {
		kvRoom = e.cfg.kvRoom(e.s.prefix.Size)
	} else {
		kvRoom = e.cfg.kvRoom(0)
	}
	wallStart := time.Now()
	next := 0
	var waiting []Request
	e.sample()
	for next < len(e.reqs) || len(waiting) > 0 || len(e.running) > 0 || len(e.preempted) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		for next < len(e.reqs) && e.reqs[next].Arrival <= e.now {
			q := e.reqs[next]
			next++
			_, maxTok, _ := e.own(q)
			if e.roundUp(memapi.Bytes(maxTok)*e.bpt) > kvRoom {
				e.out.Rejected++
				continue
			}
			waiting = append(waiting, q)
		}
		if len(e.running) == 0 && len(waiting) == 0 && len(e.preempted) == 0 {
			e.advance(e.reqs[next].Arrival - e.now)
			continue
		}
		prefill := e.resume(ctx)
		if len(e.preempted) == 0 {
			var n int
			n, waiting = e.admit(ctx, waiting)
			prefill += n
		}
		extra := e.useSecond(ctx)
		if err := ctx.Err(); err != nil {
			return err // interrupted during admission or the second model's step
		}
		if len(e.running) == 0 {
			if len(waiting) > 0 || len(e.preempted) > 0 {
				e.fail("nothing runs and %d requests wait with %s of room", len(waiting)+len(e.preempted), memreport.FormatBytes(e.room()))
				return errors.New("the run cannot make progress")
			}
			continue
		}
		d := e.cfg.Step.Duration(len(e.running), prefill) + extra
		e.out.step(len(e.running), d)
		if err := e.decode(ctx); err != nil {
			return err
		}
		e.advance(d)
		for _, a := range e.finished {
			e.s.rec.Span("request "+strconv.Itoa(a.req.ID), "request", a.admitted, e.s.clock.Now())
		}
		snap := e.sample()
		e.out.kv(e.stepStates, e.kvHeld(snap), d)
		e.checkStep(snap)
		if e.cfg.AuditEvery > 0 && e.out.Steps%e.cfg.AuditEvery == 0 {
			if err := e.fullAudit(ctx, "step "+strconv.Itoa(e.out.Steps)); err != nil {
				return err
			}
		}
		if e.cfg.Speedup > 0 {
			if ahead := time.Duration(float64(e.now)/e.cfg.Speedup) - time.Since(wallStart); ahead > 0 {
				select {
				case <-time.After(ahead):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		e.prog.update(e.progressState(len(waiting)))
	}
	e.out.finish(e.now)
	return nil
}

func (e *engine) advance(d time.Duration) {
	e.now += d
	e.s.clock.Advance(d)
}

func (e *engine) progressState(waiting int) progressState {
	a, _ := e.s.g.Authority(e.s.devAuth)
	return progressState{done: e.out.Served + e.out.Rejected, total: e.out.Requests, running: len(e.running), waiting: waiting + len(e.preempted),
		sim: e.now, charged: a.Charged, capacity: a.Capacity, preempted: e.out.Preemptions}
}

// resume admits preempted requests again, oldest first, while their tokens
// fit. It returns the tokens to recompute.
func (e *engine) resume(ctx context.Context) int {
	if len(e.preempted) == 0 {
		return 0
	}
	list := make([]*active, 0, len(e.preempted))
	for a := range e.preempted {
		list = append(list, a)
	}
	slices.SortFunc(list, func(x, y *active) int { return x.req.ID - y.req.ID })
	prefill := 0
	for _, a := range list {
		tokens := a.r.Tokens()
		need := e.roundUp(memapi.Bytes(tokens)*e.bpt) + e.watermark()
		if len(e.running) > 0 && e.room() < need {
			break // with nothing running, the governor's pressure makes the room
		}
		c, cancel := context.WithTimeout(ctx, waitLimit)
		err := e.s.kv.Resume(c, a.r)
		cancel()
		if err != nil {
			if errors.Is(err, memapi.ErrOverBudget) || ctx.Err() != nil {
				break // the room was taken meanwhile; try next iteration
			}
			e.fail("resume of request %d: %v", a.req.ID, err)
			break
		}
		delete(e.preempted, a)
		a.preempted = false
		e.running = append(e.running, a)
		e.out.Resumed++
		prefill += tokens
	}
	// Oldest first: the decode order, so growth preempts the newest.
	slices.SortFunc(e.running, func(x, y *active) int { return x.req.ID - y.req.ID })
	return prefill
}

// admit admits waiting requests first come, first served, while the
// governor has room for their prompt's KV plus one growth chunk per running
// request. It returns the prompt tokens to prefill and what still waits.
func (e *engine) admit(ctx context.Context, waiting []Request) (int, []Request) {
	prefill := 0
	for len(waiting) > 0 {
		q := waiting[0]
		prompt, maxTok, prefix := e.own(q)
		need := e.roundUp(memapi.Bytes(prompt)*e.bpt) + e.watermark()
		if len(e.running) > 0 && e.room() < need {
			break // with nothing running, the governor's pressure makes the room
		}
		c, cancel := context.WithTimeout(ctx, waitLimit)
		r, err := e.s.kv.Admit(c, holders.RequestSpec{ID: strconv.Itoa(q.ID), PromptTokens: prompt, MaxTokens: maxTok, Priority: -q.ID, Prefix: prefix})
		cancel()
		if err != nil {
			if errors.Is(err, memapi.ErrOverBudget) || ctx.Err() != nil {
				break
			}
			e.fail("admission of request %d: %v", q.ID, err)
			break
		}
		a := &active{req: q, r: r, left: q.Gen, pattern: e.token[q.ID%len(e.token)], admitted: e.s.clock.Now()}
		e.byReq[r] = a
		e.running = append(e.running, a)
		waiting = waiting[1:]
		prefill += q.Prompt
	}
	return prefill, waiting
}

// useSecond runs the second model when its period has come: every weight
// is used (reloaded first when it was offloaded). It returns the extra
// simulated time of its forward pass.
func (e *engine) useSecond(ctx context.Context) time.Duration {
	if e.s.second == nil || e.cfg.SecondEvery <= 0 || e.now < e.secondDue {
		return 0
	}
	e.secondDue = e.now + e.cfg.SecondEvery
	if err := e.waitFence(ctx); err != nil {
		if ctx.Err() == nil { // an interrupted run is not a failed one
			e.fail("%v", err)
		}
		return 0
	}
	before := e.s.second.Stats()
	var uses []*holders.WeightUse
	for _, name := range e.s.secondW {
		c, cancel := context.WithTimeout(ctx, waitLimit)
		u, err := e.s.second.Use(c, name)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				break // interrupted
			}
			e.fail("second model weight %s: %v", name, err)
			continue
		}
		uses = append(uses, u)
	}
	f, err := e.stream.Record()
	for _, u := range uses {
		if err == nil {
			err = u.RecordUse(f)
		}
		u.Done()
	}
	if err != nil {
		e.fail("second model step: %v", err)
	}
	if after := e.s.second.Stats(); after.Reloads > before.Reloads {
		e.s.rec.Annotate(memreport.Annotation{Time: e.s.clock.Now(), Authority: e.s.devAuth, Kind: "reload", Holder: holderSecond,
			Bytes: after.ReloadedTotal - before.ReloadedTotal, Detail: fmt.Sprintf("%d weights back from the host", after.Reloads-before.Reloads)})
	}
	return e.cfg.Step.Base
}

func (e *engine) waitFence(ctx context.Context) error {
	if e.fence == nil {
		return nil
	}
	c, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	if err := e.fence.Wait(c); err != nil {
		return fmt.Errorf("decode step: %w", err)
	}
	return nil
}

// decode runs one decode iteration: its activations are taken from the
// workspace, every running request grows by one token (its region grows a
// chunk when the token crosses into one, which may preempt others), the
// token's KV is written through the device stream, and the iteration's
// fence is recorded on every request, on the served model's weights and on
// the activations, which go back to the pool.
func (e *engine) decode(ctx context.Context) error {
	if err := e.waitFence(ctx); err != nil {
		return err
	}
	var uses []*holders.WeightUse
	for _, name := range e.s.modelW {
		u, err := e.s.model.Use(ctx, name)
		if err != nil {
			e.fail("served model weight %s: %v", name, err)
			continue
		}
		uses = append(uses, u)
	}
	// The forward pass's workspace first, for the requests about to run
	// it: the pool serves it from its cache or grows, which under pressure
	// asks its own cache first, then the second model and the KV store (a
	// request preempted now skips the step). The step holds it to its end,
	// so the pressure of the growth below finds in the pool's cache only
	// what this step does not use.
	interrupted := false
	if e.s.ws != nil {
		batch := 0
		for _, a := range e.running {
			if !a.preempted {
				batch++
			}
		}
		if err := e.s.ws.alloc(ctx, batch, e.stream); err != nil {
			if ctx.Err() != nil {
				interrupted = true
			} else {
				e.fail("%v", err)
			}
		}
	}
	// Grow first: every request gets its next token's memory (which may
	// preempt others), then the step's work is enqueued, so no preempted
	// region can have work of this step in flight.
	var stepped []*active
	e.finished = e.finished[:0]
grow:
	for _, a := range e.running {
		if interrupted {
			break
		}
		if a.preempted {
			continue
		}
		if a.left == 0 { // a request that generates no token ends after its prefill
			stepped = append(stepped, a)
			continue
		}
		c, cancel := context.WithTimeout(ctx, waitLimit)
		err := a.r.Append(c, 1)
		cancel()
		switch {
		case err == nil:
			// Grown, even should the run be interrupted just now: it runs
			// this step and its token is written, so what the end of the
			// run reads back is there (the next Append sees the ctx).
		case ctx.Err() != nil:
			// Interrupted: the requests grown so far still run this step,
			// so their memory and the weights' uses stay consistent.
			interrupted = true
			break grow
		case errors.Is(err, memapi.ErrOverBudget):
			e.out.Stalls++
			if errors.Is(err, context.DeadlineExceeded) {
				e.fail("request %d waited %v to grow: %v", a.req.ID, waitLimit, err)
			}
			continue
		default:
			e.fail("request %d append: %v", a.req.ID, err)
			continue
		}
		// The token is generated: if a later request's growth preempts
		// this one, its KV is recomputed on resume.
		a.left--
		e.out.Tokens++
		stepped = append(stepped, a)
	}
	e.stepStates = 0
	if e.s.prefix != nil {
		e.stepStates = memapi.Bytes(e.cfg.PrefixTokens) * e.bpt
	}
	for _, a := range stepped {
		if !a.preempted {
			e.stepStates += memapi.Bytes(a.r.Tokens()) * e.bpt
		}
	}
	for _, a := range stepped {
		if a.preempted || a.r.Tokens() == 0 {
			continue
		}
		pos := a.r.Tokens() - 1
		if a.r.Spec().Prefix != nil {
			pos += e.cfg.PrefixTokens
		}
		if err := e.stream.CopyToDevice(a.r.TokenAddr(pos), a.pattern); err != nil {
			e.fail("request %d token write: %v", a.req.ID, err)
		}
	}
	f, err := e.stream.Record()
	if err != nil {
		e.fail("record: %v", err)
	}
	e.fence = f
	if e.s.ws != nil {
		if f == nil { // no fence to free the activations behind: the stamps end first
			if err := e.stream.Synchronize(context.WithoutCancel(ctx)); err != nil {
				e.fail("synchronize: %v", err)
			}
		}
		if err := e.s.ws.release(f); err != nil {
			e.fail("activations: %v", err)
		}
	}
	for _, u := range uses {
		if f != nil {
			if err := u.RecordUse(f); err != nil {
				e.fail("weights record: %v", err)
			}
		}
		u.Done()
	}
	for _, a := range stepped {
		if a.preempted {
			continue // preempted by a later request's growth in this iteration
		}
		if f != nil {
			if err := a.r.RecordUse(f); err != nil {
				e.fail("request %d record: %v", a.req.ID, err)
			}
		}
		if a.left == 0 {
			if err := a.r.Finish(); err != nil {
				e.fail("request %d finish: %v", a.req.ID, err)
				continue
			}
			delete(e.byReq, a.r)
			e.out.Served++
			e.finished = append(e.finished, a)
		}
	}
	e.running = slices.DeleteFunc(e.running, func(a *active) bool { return a.preempted || a.left == 0 && a.r.State() == holders.Finished })
	if interrupted {
		return ctx.Err()
	}
	return nil
}

// sample feeds the report and the peaks.
func (e *engine) sample() governor.Snapshot {
	snap := e.s.g.Snapshot()
	e.s.rec.Sample(snap)
	for _, a := range snap.Authorities {
		if a.ID != e.s.devAuth {
			continue
		}
		e.out.PeakCharged = max(e.out.PeakCharged, a.Charged)
		e.out.PeakInUse = max(e.out.PeakInUse, a.Reserved+a.Charged+a.Pending)
	}
	return snap
}

// kvHeld returns the device bytes the KV store holds in snap: charged
// (its requests and the shared prefix), pending free and reserved.
func (e *engine) kvHeld(snap governor.Snapshot) memapi.Bytes {
	for _, h := range snap.Holders {
		if h.ID != holderKV {
			continue
		}
		for _, ha := range h.Authorities {
			if ha.Authority == e.s.devAuth {
				return ha.Charged + ha.Pending + ha.Reserved
			}
		}
	}
	return 0
}

// checkStep checks the ledger identity on a snapshot: every authority
// balances (reserved + charged + pending + free = capacity), its holders'
// figures add up to its own, and no mechanism holds memory the ledger does
// not account for (frees run concurrently on the queues, so the mechanism
// may hold less, never more).
func (e *engine) checkStep(snap governor.Snapshot) {
	used := map[memapi.AuthorityID]memapi.Bytes{e.s.devAuth: e.s.devMech.UsedBytes(), hostAuthority: e.s.hostCPU.UsedBytes()}
	for _, a := range snap.Authorities {
		e.out.Checks++
		if !a.Balanced() {
			e.fail("ledger of %s does not balance: reserved %d + charged %d + pending %d + free %d != capacity %d", a.ID, a.Reserved, a.Charged, a.Pending, a.Free, a.Capacity)
		}
		var r, c, p memapi.Bytes
		for _, h := range snap.Holders {
			for _, ha := range h.Authorities {
				if ha.Authority == a.ID {
					r, c, p = r+ha.Reserved, c+ha.Charged, p+ha.Pending
				}
			}
		}
		if r != a.Reserved || c != a.Charged || p != a.Pending {
			e.fail("holders of %s add up to reserved %d charged %d pending %d, the authority says %d %d %d", a.ID, r, c, p, a.Reserved, a.Charged, a.Pending)
		}
		if u, ok := used[a.ID]; ok && u > a.Reserved+a.Charged+a.Pending {
			e.fail("mechanism of %s holds %d bytes, the ledger accounts for %d", a.ID, u, a.Reserved+a.Charged+a.Pending)
		}
	}
}

// fullAudit waits for the step and the deferred frees, then compares the
// ledger with the holders, the mechanisms and the kernel, and reads back
// bytes written earlier: the shared prefix, a running request's last token,
// and the head of every resident weight (offloaded and reloaded ones too).
func (e *engine) fullAudit(ctx context.Context, when string) error {
	if err := e.waitFence(ctx); err != nil {
		return err
	}
	c, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	if err := errors.Join(e.s.devCtx.Queue().Drain(c), e.s.hostCtx.Queue().Drain(c)); err != nil {
		if ctx.Err() == nil {
			e.fail("%s: draining the deferred-free queues: %v", when, err)
		}
		return err
	}
	e.out.KernelChecks++
	snap := e.s.g.Snapshot()
	holder := func(id string, auth memapi.AuthorityID) governor.HolderAuthoritySnapshot {
		for _, h := range snap.Holders {
			if string(h.ID) == id {
				for _, ha := range h.Authorities {
					if ha.Authority == auth {
						return ha
					}
				}
			}
		}
		return governor.HolderAuthoritySnapshot{}
	}
	for _, a := range snap.Authorities {
		used := e.s.hostCPU.UsedBytes()
		if a.ID == e.s.devAuth {
			used = e.s.devMech.UsedBytes()
		}
		if a.Reserved != 0 || a.Pending != 0 || a.Charged != used {
			e.fail("%s: %s at rest: reserved %d, pending %d, charged %d, but the mechanism holds %d", when, a.ID, a.Reserved, a.Pending, a.Charged, used)
		}
	}
	// The holders' own accounts agree with the ledger.
	kv := e.s.kv.Stats()
	want := kv.Bytes
	if e.s.prefix != nil {
		want += e.s.prefix.Size
	}
	if got := holder(holderKV, e.s.devAuth).Charged; got != want {
		e.fail("%s: the KV store holds %d bytes (requests + prefix), the ledger charges it %d", when, want, got)
	}
	e.out.CopyOnWrites = kv.CopyOnWrites
	own := want // the holders' own accounts of the device bytes
	for _, r := range []struct {
		id string
		s  *holders.Residency
	}{{holderModel, e.s.model}, {holderSecond, e.s.second}} {
		if r.s == nil {
			continue
		}
		st := r.s.Stats()
		own += st.ResidentBytes
		if got := holder(r.id, e.s.devAuth).Charged; got != st.ResidentBytes {
			e.fail("%s: %s has %d bytes resident, the ledger charges %d on the device", when, r.id, st.ResidentBytes, got)
		}
		if got := holder(r.id, hostAuthority).Charged; got != st.OffloadedBytes {
			e.fail("%s: %s has %d bytes offloaded, the ledger charges %d on the host", when, r.id, st.OffloadedBytes, got)
		}
	}
	if e.s.ws != nil {
		own += e.auditPool(when, holder(holderPool, e.s.devAuth))
	}
	// Every byte the device mechanism holds is one a holder accounts for.
	if used := e.s.devMech.UsedBytes(); own != used {
		e.fail("%s: the holders account for %d device bytes, the mechanism holds %d", when, own, used)
	}
	// The kernel agrees with the mechanisms.
	for _, m := range []struct {
		name string
		used usedBytes
		kb   func() (memapi.Bytes, error)
	}{{"device", e.s.devMech, kernelOf(e.s.devCPU)}, {"host", e.s.hostCPU, e.s.hostCPU.KernelBytes}} {
		if m.kb == nil {
			continue
		}
		k, err := m.kb()
		if err != nil {
			e.fail("%s: kernel bytes of the %s mechanism: %v", when, m.name, err)
			continue
		}
		u := m.used.UsedBytes()
		if k != u {
			e.fail("%s: the kernel holds %d bytes for the %s mechanism, which reports %d", when, k, m.name, u)
		}
		if m.name == "device" {
			e.out.KernelBeforeEnd, e.out.UsedBeforeEnd = k, u
			if u >= e.out.UsedAtPeak {
				e.out.KernelAtPeak, e.out.UsedAtPeak = k, u
			}
		}
	}
	return e.readBack(c, when)
}

// auditPool checks the activation pool's ledger identity at rest (the step
// ended and the deferred frees drained): its cached and in-use bytes make
// up its segments, the governor charges the holder its segments plus what
// failed to release (quarantined, and booked so there), and the snapshot's
// cached bytes are the pool's. It returns the device bytes the pool holds.
func (e *engine) auditPool(when string, ha governor.HolderAuthoritySnapshot) memapi.Bytes {
	st := e.s.ws.pool.Stats()
	e.out.PoolAudits++
	if st.Cached+st.InUse != st.Segments {
		e.fail("%s: the activation pool caches %d and has %d in use, but holds %d", when, st.Cached, st.InUse, st.Segments)
	}
	if ha.Charged != st.Segments+st.Quarantined || ha.Quarantined != st.Quarantined {
		e.fail("%s: the activation pool holds %d bytes (%d quarantined), the ledger charges %d (%d quarantined)", when, st.Segments, st.Quarantined, ha.Charged, ha.Quarantined)
	}
	if ha.Cached != st.Cached {
		e.fail("%s: the activation pool caches %d bytes, the ledger's snapshot says %d", when, st.Cached, ha.Cached)
	}
	if st.InUse != 0 {
		e.fail("%s: %d bytes of activations in use between steps", when, st.InUse)
	}
	return st.Segments + st.Quarantined
}

// procMemory returns the process's resident memory and its high-water mark
// (VmRSS and VmHWM of /proc/self/status), or zeros where they are unknown.
func procMemory() (rss, peak memapi.Bytes) {
	u, err := procmem.Self()
	if err != nil {
		return 0, 0
	}
	return memapi.Bytes(u.RSS), memapi.Bytes(u.Peak)
}

// kernelOf returns the kernel's count for a CPU mechanism, nil for none.
func kernelOf(m *cpu.Mechanism) func() (memapi.Bytes, error) {
	if m == nil {
		return nil
	}
	return m.KernelBytes
}

// readBack copies bytes back from the device and compares them with what
// was written.
func (e *engine) readBack(ctx context.Context, when string) error {
	check := func(what string, addr memapi.DeviceAddr, want []byte) {
		if ctx.Err() != nil {
			return // interrupted: no verdict
		}
		got := make([]byte, len(want))
		err := e.stream.CopyFromDevice(got, addr)
		if err == nil {
			err = e.stream.Synchronize(ctx)
		}
		e.out.DataChecks++
		switch {
		case ctx.Err() != nil:
		case err != nil:
			e.fail("%s: reading back %s: %v", when, what, err)
		case !bytes.Equal(got, want):
			e.fail("%s: %s read back different bytes", when, what)
		}
	}
	for _, a := range e.running {
		if a.preempted || a.r.Tokens() == 0 || a.req.Gen == a.left {
			continue
		}
		if a.r.Spec().Prefix != nil && a.r.Shared() {
			check("the shared prefix through request "+strconv.Itoa(a.req.ID), a.r.TokenAddr(0), e.s.prefixData[:min(len(e.s.prefixData), 4096)])
		}
		pos := a.r.Tokens() - 1
		if a.r.Spec().Prefix != nil {
			pos += e.cfg.PrefixTokens
		}
		check("the last token of request "+strconv.Itoa(a.req.ID), a.r.TokenAddr(pos), a.pattern)
		break
	}
	for _, r := range []struct {
		s     *holders.Residency
		names []string
	}{{e.s.model, e.s.modelW}, {e.s.second, e.s.secondW}} {
		if r.s == nil {
			continue
		}
		resident := map[string]bool{}
		for _, w := range r.s.Weights() {
			resident[w.Name] = w.Resident
		}
		for _, name := range r.names {
			if !resident[name] {
				continue
			}
			u, err := r.s.Use(ctx, name)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				e.fail("%s: use of %s: %v", when, name, err)
				continue
			}
			check("the head of weight "+name, u.Addr, e.s.weightHead[name])
			u.Done()
		}
	}
	return ctx.Err()
}

// finish audits the end of the run, closes everything and checks that every
// byte came back.
func (e *engine) finish(ctx context.Context) error {
	var errs []error
	if e.stream != nil {
		if err := e.fullAudit(ctx, "end of the run"); err != nil {
			errs = append(errs, err)
		}
		// The report's tables show the ledger as the work ended, before
		// everything is closed (the chart still shows the closing).
		e.s.rec.End(e.s.g.Snapshot())
		if e.s.second != nil {
			st := e.s.second.Stats()
			e.out.Offloads, e.out.Reloads = st.Offloads, st.Reloads
		}
		if e.s.ws != nil {
			e.out.Pool, e.out.PoolLargest, e.out.PoolSteps = e.s.ws.pool.Stats(), e.s.ws.largest, e.s.ws.steps
			e.out.PoolLatency = summarise(e.s.ws.latency)
		}
		errs = append(errs, e.stream.Close())
	}
	// Requests still holding memory (a run cut short) are finished here.
	for _, a := range e.running {
		errs = append(errs, a.r.Finish())
	}
	for a := range e.preempted {
		errs = append(errs, a.r.Finish())
	}
	if n := len(e.running) + len(e.preempted); n > 0 && e.out.Served+e.out.Rejected == e.out.Requests {
		e.fail("%d requests still held memory after every request was served", n)
	}
	a, _ := e.s.g.Authority(e.s.devAuth)
	e.out.PressureEvents, e.out.Tickets, e.out.Reclaimed = a.PressureEvents, a.Tickets, a.Freed
	e.out.PreemptedRequests = len(e.everPre)
	c, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	dq, hq := e.s.devCtx.Queue().Stats(), e.s.hostCtx.Queue().Stats()
	closeErr := e.s.close(c)
	dq2, hq2 := e.s.devCtx.Queue().Stats(), e.s.hostCtx.Queue().Stats()
	e.out.DeferredFrees = max(dq.Freed, dq2.Freed) + max(hq.Freed, hq2.Freed)
	if closeErr != nil {
		e.fail("closing the memory system: %v", closeErr)
		errs = append(errs, closeErr)
	}
	// Caches first: a round that asked another holder first, or evicted
	// data the pool's idle cache covered, is a failed check.
	pf := e.s.rounds.figures()
	e.out.PoolPressure = pf
	e.out.Failures += pf.Violations
	for _, v := range pf.ViolationLog {
		if len(e.out.FailureLog) < 20 {
			e.out.FailureLog = append(e.out.FailureLog, "caches first: "+v)
		}
	}
	if e.s.ws != nil {
		e.out.PoolAfter = e.s.ws.pool.Stats()
		if pf.PoolFreed != e.out.Pool.Reclaimed {
			e.fail("the activation pool counts %d bytes reclaimed, the governor's events %d", e.out.Pool.Reclaimed, pf.PoolFreed)
		}
		if st := e.out.PoolAfter; st.Segments != 0 || st.Quarantined != 0 || st.InUse != 0 {
			e.fail("after close, the activation pool holds %d bytes (%d quarantined, %d in use)", st.Segments, st.Quarantined, st.InUse)
		}
	}
	// Everything returned: the ledger is full again, the mechanisms and the
	// kernel hold nothing.
	snap := e.s.g.Snapshot()
	e.s.rec.Sample(snap)
	for _, a := range snap.Authorities {
		e.out.FreeAfter = append(e.out.FreeAfter, a.Free)
		e.out.CapacitiesAfter = append(e.out.CapacitiesAfter, a.Capacity)
		if a.Free != a.Capacity {
			e.fail("after close, %s has %d of %d bytes free", a.ID, a.Free, a.Capacity)
		}
	}
	e.out.UsedAfter = e.s.devMech.UsedBytes() + e.s.hostCPU.UsedBytes()
	if e.out.UsedAfter != 0 {
		e.fail("after close, the mechanisms still hold %d bytes", e.out.UsedAfter)
	}
	for _, kb := range []func() (memapi.Bytes, error){kernelOf(e.s.devCPU), e.s.hostCPU.KernelBytes} {
		if kb == nil {
			continue
		}
		k, err := kb()
		if err != nil {
			e.fail("after close: kernel bytes: %v", err)
		}
		e.out.KernelAfter += k
	}
	if e.out.KernelAfter != 0 {
		e.fail("after close, the kernel still holds %d bytes for the mechanisms", e.out.KernelAfter)
	}
	return errors.Join(errs...)
}
