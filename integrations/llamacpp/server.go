package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// ServerOptions configure NewServer.
type ServerOptions struct {
	// Name is the model's id in the API (GET /v1/models, and each
	// response's "model"). Default "memgen".
	Name string
	// Sequences is how many requests decode together: the context's
	// sequences, one per request. Default 16.
	Sequences int
	// NCtx is the most tokens of one request, prompt and completion
	// together (a multiple of 256). Default 2048.
	NCtx int
	// Batch is the context's Batch (the most tokens one llama_decode
	// takes). Default 512.
	Batch int
	// MaxTokens is a request's max_tokens when it names none. Default 256.
	MaxTokens int
	// Budget is the KV bytes the running requests may hold together: a
	// request is admitted when the KV of its prompt and max_tokens fits
	// beside the running ones' (and a sequence is free). Default: the
	// authority's free bytes once the context is made, less an eighth.
	// A stock model (Options.Stock) has its whole KV cache from the
	// start, as llama-server has: it admits by free sequence alone, and
	// Budget is ignored.
	Budget memapi.Bytes
	// QueueTimeout is how long a request waits to be admitted before it
	// is refused (HTTP 429 with Retry-After). Default 2 s.
	QueueTimeout time.Duration
	// StepTimeout bounds each batched decode (its growth's wait for the
	// governor included). Default 30 s.
	StepTimeout time.Duration
	// SleepAfter, when positive, puts the model to sleep
	// (Model.SleepLevel at SleepLevel, into SleepTo) once no request has
	// run for that long, and the next request wakes it (Model.Wake,
	// bounded by StepTimeout) before it decodes. 0: never.
	SleepAfter time.Duration
	// SleepLevel is the level an idle model sleeps at: 1 (the default)
	// moves the weights to SleepTo; 2 discards them and the next request
	// reloads them from the model file. An idle server has no running
	// sequence, so at level 2 nothing of the KV cache moves.
	SleepLevel int
	// SleepTo is the host tier an idle model sleeps into: a binding of the
	// model's manager on another authority. Required with SleepAfter at
	// level 1; at level 2 it takes the weights that are not the model
	// file's (none unless llama.cpp converted some at load), and may be
	// nil when there are none (the sleeps fail otherwise: SleepErrors).
	SleepTo *pmm.Binding
	// SleepOnPressure puts the idle model to sleep (at SleepLevel, into
	// SleepTo) when the governor asks its weights for memory: a shortfall
	// on the device's authority or, on a shared ledger, another process's
	// want (xproc answers a want with pressure tickets to this process's
	// holders). The weights' holder answers the ticket with the device
	// bytes the sleep gave back (the weights' and the KV cache's). While a
	// request runs or waits to run it gives nothing and counts the ticket
	// (ServerStats.PressureBusy); the context's own holder answers as
	// always. The next request wakes the model. The model must be loaded
	// with Options.SleepOnPressure; at level 1 SleepTo is required.
	SleepOnPressure bool
}

// Server decodes requests together in one context of a Model: each
// running request is one of the context's sequences, and every step
// decodes one token of each running request in one DecodeBatch, and each
// new request's whole prompt in a DecodeBatch of its own, the decode
// tokens in decreasing order of their sequences. A request's tokens then
// do not depend on the others': were a prompt decoded beside decode
// tokens, a ubatch of 64 or more would take ggml's tiled attention path
// for them, which sums in another order; and llama.cpp computes a ubatch
// whose sequences come in increasing order differently from each row
// alone, where one in decreasing order is computed exactly as each row
// alone. Its HTTP API is Handler. Admission is by slot and KV budget: a
// request that cannot be admitted within QueueTimeout is refused, never
// queued without bound.
type Server struct {
	m    *Model
	c    *Context
	opts ServerOptions
	// kvPerToken is the KV bytes one token takes (all tensors' rows);
	// kvSlack what rounding to granules adds to a request at most.
	kvPerToken, kvSlack memapi.Bytes

	mu      sync.Mutex
	free    []int         // free sequences
	used    memapi.Bytes  // KV budget of the admitted requests
	changed chan struct{} // closed (and replaced) when a slot or budget is released
	state   error         // nil: serving; errClosing, or the engine's failure
	jobs    chan *job     // admitted, not yet decoding
	done    chan struct{} // the loop ended
	// asks carries pressure tickets to the loop (SleepOnPressure), one
	// at a time (its room): the loop answers one while idle, waiting for
	// a request, and with nothing between steps. sleeping is set while
	// the loop puts the model to sleep.
	asks     chan pressureAsk
	sleeping atomic.Bool

	stop  context.CancelFunc
	ctx   context.Context
	stats ServerStats // under mu
}

// ServerStats are a server's counters.
type ServerStats struct {
	Served  int64 // requests completed
	Failed  int64 // requests admitted that ended in an error (their client went away, a decode failed, the server closed)
	Refused int64 // requests refused for want of a sequence or budget (HTTP 429): none was free at the refusal
	// SlotTime is the time requests held sequences, summed: over the
	// server's life times Sequences, how busy it was.
	SlotTime time.Duration
	// Running is the requests holding a sequence now, Peak the most that
	// ever did at once, Sequences the context's.
	Running, Peak, Sequences int
	// Budget is the KV budget, Admitted the part of it the running
	// requests hold (their prompts and max_tokens).
	Budget, Admitted memapi.Bytes
	// Preemptions is the times the context gave its KV cache up under
	// pressure, Recomputed the tokens decoded again after them (the
	// context's Stats, as of the last step).
	Preemptions, Recomputed int
	// Sleeps and Wakes count the idle model's sleeps and the wakes the
	// next requests made (ServerOptions.SleepAfter); Asleep says whether
	// it is asleep now; WakeTime is the wakes' time, summed. SleepErrors
	// counts sleeps that failed (the model stayed awake).
	Sleeps, Wakes, SleepErrors int64
	Asleep                     bool
	WakeTime                   time.Duration
	// PressureSleeps counts the sleeps pressure tickets made
	// (SleepOnPressure; Sleeps counts them too), PressureFreed the device
	// bytes they gave back, and PressureBusy the tickets answered with
	// nothing because a request was running or waiting, or another
	// ticket was waiting for the loop.
	PressureSleeps, PressureBusy int64
	PressureFreed                memapi.Bytes
}

// Stats returns the server's counters.
func (s *Server) Stats() ServerStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Sequences = s.opts.Sequences
	st.Running = s.opts.Sequences - len(s.free)
	st.Budget, st.Admitted = s.opts.Budget, s.used
	return st
}

// errClosing is the state of a Server being closed.
var errClosing = errors.New("llamacpp: the server is closing")

// ErrBusy refuses a request that could not be admitted within the queue
// timeout: every sequence was busy, or the KV budget was held.
var ErrBusy = errors.New("llamacpp: the server is busy")

// job is one admitted request.
type job struct {
	seq     int
	prompt  []int32
	max     int
	need    memapi.Bytes
	sampler *Sampler
	ctx     context.Context // the request's: when it ends, the job is dropped

	// Written by the loop; events carries each generated token, then the
	// end (ok false: see err).
	out    []int32
	events chan event
	start  time.Time // admitted
}

type event struct {
	token  int32
	top    TopLogits // the token's logit and the runner-up's
	end    bool
	reason string // "length" or "stop" at the end
	err    error  // at the end: why the job failed
}

// NewServer opens the model's context (opts.Sequences sequences of
// opts.NCtx cells) and starts decoding. ctx bounds the context's creation,
// its wait for memory other holders give back included (on a shared
// ledger, other processes'). Close the server to stop.
func NewServer(ctx context.Context, m *Model, opts ServerOptions) (*Server, error) {
	if opts.Name == "" {
		opts.Name = "memgen"
	}
	if opts.Sequences <= 0 {
		opts.Sequences = 16
	}
	if opts.NCtx <= 0 {
		opts.NCtx = 2048
	}
	if opts.Batch <= 0 {
		opts.Batch = 512
	}
	if opts.MaxTokens <= 0 {
		opts.MaxTokens = 256
	}
	if opts.QueueTimeout <= 0 {
		opts.QueueTimeout = 2 * time.Second
	}
	if opts.StepTimeout <= 0 {
		opts.StepTimeout = 30 * time.Second
	}
	if opts.SleepLevel == 0 {
		opts.SleepLevel = 1
	}
	if opts.SleepLevel != 1 && opts.SleepLevel != 2 {
		return nil, fmt.Errorf("llamacpp.NewServer: SleepLevel %d: %w", opts.SleepLevel, ErrSleepLevel)
	}
	if opts.SleepAfter > 0 && opts.SleepLevel == 1 && opts.SleepTo == nil {
		return nil, memapi.Errorf("llamacpp.NewServer", memapi.ErrNilHandle, "SleepAfter at level 1 needs SleepTo, the host tier to sleep into")
	}
	if opts.SleepOnPressure {
		if !m.opts.SleepOnPressure {
			return nil, memapi.Errorf("llamacpp.NewServer", memapi.ErrUnsupported, "SleepOnPressure needs the model loaded with Options.SleepOnPressure (its weights' holder is then asked under pressure)")
		}
		if opts.SleepLevel == 1 && opts.SleepTo == nil {
			return nil, memapi.Errorf("llamacpp.NewServer", memapi.ErrNilHandle, "SleepOnPressure at level 1 needs SleepTo, the host tier to sleep into")
		}
	}
	c, err := m.NewContext(ctx, ContextOptions{NCtx: opts.NCtx, Sequences: opts.Sequences, Batch: opts.Batch})
	if err != nil {
		return nil, err
	}
	s := &Server{m: m, c: c, opts: opts, changed: make(chan struct{}), jobs: make(chan *job, opts.Sequences),
		done: make(chan struct{}), asks: make(chan pressureAsk, 1)}
	for _, t := range c.tensors {
		s.kvPerToken += t.rowBytes
		s.kvSlack += t.region.Granularity()
	}
	switch {
	case m.opts.Stock:
		// llama.cpp allocated every sequence's NCtx cells with the
		// context, as llama-server does: a free sequence is all a request
		// needs (need is 0), and the budget is not read.
		s.opts.Budget = 0
	case s.opts.Budget == 0:
		s.opts.Budget = c.free() - c.free()/8
	}
	for i := range opts.Sequences {
		s.free = append(s.free, i)
	}
	s.ctx, s.stop = context.WithCancel(context.Background())
	if opts.SleepOnPressure {
		if err := m.setOnPressure(s.onPressure); err != nil {
			s.stop()
			return nil, errors.Join(err, c.Close(ctx))
		}
	}
	go s.loop()
	return s, nil
}

// kvNeed is what a request of n tokens may hold at most: its rows, the
// rest of a 64-row tile its prompt's decode may touch, and a granule per
// tensor of rounding.
func (s *Server) kvNeed(n int) memapi.Bytes { return memapi.Bytes(n+kvTile)*s.kvPerToken + s.kvSlack }

// admit waits (at most QueueTimeout, and no longer than ctx) for a free
// sequence and room in the budget for a request of prompt and max tokens,
// and hands it to the loop. It fails with ErrBusy when the wait ends, with
// the server's state when it is closing or failed, and with a
// memapi.ErrInvalidSize error when the request could never fit.
func (s *Server) admit(ctx context.Context, prompt []int32, max int, sampler *Sampler) (*job, error) {
	need := s.kvNeed(len(prompt) + max)
	if need > s.opts.Budget {
		return nil, memapi.Errorf("llamacpp.Server", memapi.ErrInvalidSize, "a request of %d tokens needs %d bytes of KV; the budget is %d", len(prompt)+max, need, s.opts.Budget)
	}
	timer := time.NewTimer(s.opts.QueueTimeout)
	defer timer.Stop()
	last := false // the timeout fired: one more look, then a refusal
	for {
		s.mu.Lock()
		if s.state != nil {
			err := s.state
			s.mu.Unlock()
			return nil, err
		}
		if len(s.free) > 0 && s.used+need <= s.opts.Budget {
			j := &job{seq: s.free[len(s.free)-1], prompt: prompt, max: max, need: need, sampler: sampler, ctx: ctx, events: make(chan event, max+1), start: time.Now()}
			s.free = s.free[:len(s.free)-1]
			if running := s.opts.Sequences - len(s.free); running > s.stats.Peak {
				s.stats.Peak = running
			}
			s.used += need
			// Under mu, so that Close (which sets the state under mu, then
			// drains the channel once the loop ended) never misses it; the
			// channel has room for every sequence: this never blocks.
			s.jobs <- j
			s.mu.Unlock()
			return j, nil
		}
		if last {
			err := s.refuseLocked(need)
			s.mu.Unlock()
			return nil, err
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			// Room may have come as the timer fired: the loop looks once
			// more before it refuses.
			last = true
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// refuseLocked counts a refusal of a request of need bytes, and returns
// ErrBusy; s.mu is held.
func (s *Server) refuseLocked(need memapi.Bytes) error {
	s.stats.Refused++
	if refused != nil {
		refused(s.state == nil && len(s.free) > 0 && s.used+need <= s.opts.Budget)
	}
	return ErrBusy
}

// stepCall, set by tests, is called with the entries of each DecodeBatch
// the loop makes.
var stepCall func(in []SeqTokens)

// refused, set by tests, is called at each refusal with whether a sequence
// and the budget were free at that moment (they must not be).
var refused func(room bool)

// release gives a finished job's sequence and budget back.
func (s *Server) release(j *job, failed bool) {
	s.mu.Lock()
	s.free = append(s.free, j.seq)
	s.used -= j.need
	s.stats.SlotTime += time.Since(j.start)
	if failed {
		s.stats.Failed++
	} else {
		s.stats.Served++
	}
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// loop decodes the running jobs together until the server stops.
func (s *Server) loop() {
	defer close(s.done)
	var active []*job
	defer func() {
		for _, j := range active {
			s.finish(j, event{end: true, err: errClosing})
		}
	}()
	for {
		// Take the admitted jobs; with none running, wait for one (and,
		// idle for SleepAfter, put the model to sleep meanwhile).
		if len(active) == 0 {
			j, ok := s.idle()
			if !ok {
				return
			}
			active = append(active, j)
		}
	more:
		for {
			select {
			case j := <-s.jobs:
				active = append(active, j)
			case ask := <-s.asks: // it came as a request was admitted
				ask.reply <- pressureAnswer{freed: s.busy()}
			default:
				break more
			}
		}
		// Drop the jobs whose request went away.
		kept := active[:0]
		for _, j := range active {
			if j.ctx.Err() != nil {
				s.finish(j, event{end: true, err: context.Cause(j.ctx)})
				continue
			}
			kept = append(kept, j)
		}
		active = kept
		if len(active) == 0 {
			continue
		}
		// A step decodes the running sequences' next tokens together, and
		// each new request's prompt in a call of its own: a decode token's
		// attention is then computed the same way whether or not prompts
		// arrive beside it (below 64 queries in a ubatch ggml's
		// flash-attention kernel takes its one-query path, at 64 or more
		// its tiled one, which sums in another order), so a request's
		// greedy tokens do not depend on the prompts other requests send.
		next := make([]int32, len(active))
		tops := make([]TopLogits, len(active))
		errs := make([]error, len(active))
		var groups [][]int
		var decodes []int
		for i, j := range active {
			if len(j.out) == 0 {
				groups = append(groups, []int{i})
			} else {
				decodes = append(decodes, i)
			}
		}
		if len(decodes) > 0 {
			// Highest sequence first: llama.cpp computes a ubatch whose
			// sequences come in increasing order differently (every row of
			// it), and one in decreasing order exactly as each row alone.
			slices.SortFunc(decodes, func(a, b int) int { return active[b].seq - active[a].seq })
			groups = append([][]int{decodes}, groups...)
		}
		var failed error
		for _, g := range groups {
			in := make([]SeqTokens, len(g))
			for k, i := range g {
				j := active[i]
				toks := j.prompt
				if len(j.out) > 0 {
					toks = j.out[len(j.out)-1:]
				}
				in[k] = SeqTokens{Seq: j.seq, Tokens: toks, Sampler: j.sampler, Top: &tops[i]}
			}
			if stepCall != nil {
				stepCall(in)
			}
			ctx, cancel := context.WithTimeout(s.ctx, s.opts.StepTimeout)
			out, err := s.c.DecodeBatch(ctx, in)
			cancel()
			for k, i := range g {
				if err != nil {
					errs[i] = err
				} else {
					next[i] = out[k]
				}
			}
			if err != nil && (errors.Is(err, ErrDecode) || errors.Is(err, memapi.ErrClosed)) {
				failed = err
				break // a broken engine or a closed context: nothing more is decoded
			}
		}
		if failed != nil {
			// The server fails: every job does (the ones decoded this step
			// too: their sequences' cells are dropped at the finish).
			for _, j := range active {
				s.finish(j, event{end: true, err: fmt.Errorf("llamacpp: decoding: %w", failed)})
			}
			active = nil
			s.mu.Lock()
			if s.state == nil {
				s.state = failed
			}
			s.mu.Unlock()
			if s.ctx.Err() != nil {
				return
			}
			continue
		}
		cs := s.c.Stats()
		s.mu.Lock()
		s.stats.Preemptions, s.stats.Recomputed = cs.Preemptions, cs.Recomputed
		s.mu.Unlock()
		kept = active[:0]
		for i, j := range active {
			if errs[i] != nil {
				// Its call is as before the step; the job fails.
				s.finish(j, event{end: true, err: fmt.Errorf("llamacpp: decoding: %w", errs[i])})
				continue
			}
			t := next[i]
			j.out = append(j.out, t)
			j.events <- event{token: t, top: tops[i]}
			switch {
			case s.m.IsEndOfGeneration(t):
				s.finish(j, event{end: true, reason: "stop"})
			case len(j.out) >= j.max:
				s.finish(j, event{end: true, reason: "length"})
			default:
				kept = append(kept, j)
			}
		}
		active = kept
	}
}

// finish ends a job: its sequence is dropped from the context (its ranges
// decommitted), its slot and budget released, and its end sent.
func (s *Server) finish(j *job, end event) {
	if err := s.c.ResetSeq(context.Background(), j.seq); err != nil && end.err == nil {
		end = event{end: true, err: err}
	}
	s.release(j, end.err != nil)
	j.events <- end
}

// Close stops admitting (requests get 503), ends the running requests,
// waits for the loop and closes the context (bounded by ctx).
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.state == errClosing {
		s.mu.Unlock()
		return memapi.Errorf("llamacpp.Server.Close", memapi.ErrClosed, "the server was closed")
	}
	s.state = errClosing
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	if s.opts.SleepOnPressure {
		_ = s.m.setOnPressure(nil)
	}
	s.stop()
	select {
	case <-s.done:
	case <-ctx.Done():
		return fmt.Errorf("llamacpp.Server.Close: waiting for the decode loop: %w", ctx.Err())
	}
	// Jobs admitted but never taken by the loop, and running ones it left.
	for {
		select {
		case j := <-s.jobs:
			s.finish(j, event{end: true, err: errClosing})
			continue
		default:
		}
		break
	}
	return s.c.Close(ctx)
}
