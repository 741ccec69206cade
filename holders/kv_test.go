package holders_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/holders"
	"github.com/stretchr/testify/require"
)

func TestModelShapeBytesPerToken(t *testing.T) {
	// Llama-2-7B: 32 layers, 32 kv heads, 128 dims, fp16: 512 KiB per token.
	require.Equal(t, memapi.Bytes(512<<10), holders.ModelShape{Layers: 32, KVHeads: 32, HeadDim: 128, DTypeBytes: 2}.BytesPerToken())
	require.Equal(t, memapi.Bytes(1024), shape.BytesPerToken())
	err := holders.ModelShape{Layers: 2}.Validate()
	require.ErrorIs(t, err, memapi.ErrInvalidSize)
}

// A request reserves its maximum context once and grows in granularity
// chunks: the governor is asked only when tokens cross into a new chunk.
func TestKVGrowsInGranules(t *testing.T) {
	r := newRig(t, 1<<20, 1<<20)
	s := r.kv(t, governor.HolderOptions{}, nil)
	ctx := context.Background()

	req, err := s.Admit(ctx, holders.RequestSpec{ID: "a", PromptTokens: 3, MaxTokens: 64})
	require.NoError(t, err)
	require.Equal(t, 1, r.devM.ReserveCallCount())
	require.Equal(t, memapi.Bytes(gran), req.Len())
	require.Equal(t, 1, r.devM.CommitCallCount())
	addr := req.Addr()

	granted := func() uint64 { a, _ := r.g.Authority(devAuth); return a.Granted }
	before := granted()
	require.NoError(t, req.Append(ctx, 1)) // 4 tokens: still one chunk
	require.Equal(t, before, granted(), "no reservation inside a chunk")
	require.Equal(t, 1, r.devM.CommitCallCount())
	require.NoError(t, req.Append(ctx, 1)) // 5 tokens: a second chunk
	require.Equal(t, before+1, granted())
	require.Equal(t, 2, r.devM.CommitCallCount())
	require.Equal(t, memapi.Bytes(2*gran), req.Len())
	require.Equal(t, 5, req.Tokens())
	require.Equal(t, addr, req.Addr(), "the address never moves")
	require.Equal(t, memapi.Bytes(2*gran), r.charged("kv", devAuth))
	r.audit(t, "grown")

	err = req.Append(ctx, 60)
	require.ErrorIs(t, err, memapi.ErrInvalidRange, "past MaxTokens")
	require.Equal(t, 5, req.Tokens())

	require.NoError(t, req.Finish())
	require.NoError(t, req.Finish(), "idempotent")
	require.ErrorIs(t, req.Append(ctx, 1), memapi.ErrClosed)
	require.NoError(t, s.Close())
	r.audit(t, "end")
	require.Zero(t, r.devM.UsedBytes())
	st := s.Stats()
	require.Equal(t, uint64(1), st.Admitted)
	require.Equal(t, uint64(1), st.Finished)
}

// A failure at any step of a growth leaves the request and the ledger as
// they were.
func TestKVAppendFailureChangesNothing(t *testing.T) {
	boom := errors.New("boom")
	for _, method := range []string{"Commit", "Reserve"} {
		t.Run(method, func(t *testing.T) {
			r := newRig(t, 1<<20, 1<<20)
			s := r.kv(t, governor.HolderOptions{}, nil)
			ctx := context.Background()
			if method == "Reserve" {
				r.devM.Inject(fakes.Fault{Method: "Reserve", Err: boom})
				_, err := s.Admit(ctx, holders.RequestSpec{ID: "a", PromptTokens: 3, MaxTokens: 64})
				require.ErrorIs(t, err, boom)
				require.Equal(t, holders.KVStats{}, s.Stats())
				r.audit(t, "failed admit")
				require.Zero(t, r.devM.UsedBytes())
				require.NoError(t, s.Close())
				return
			}
			req, err := s.Admit(ctx, holders.RequestSpec{ID: "a", PromptTokens: 4, MaxTokens: 64})
			require.NoError(t, err)
			r.audit(t, "admitted")
			used := r.devM.UsedBytes()
			r.devM.Inject(fakes.Fault{Method: "Commit", Err: memapi.ErrOutOfMemory})
			require.ErrorIs(t, req.Append(ctx, 1), memapi.ErrOutOfMemory)
			require.Equal(t, 4, req.Tokens())
			require.Equal(t, memapi.Bytes(gran), req.Len())
			require.Equal(t, used, r.devM.UsedBytes())
			r.audit(t, "failed append")
			r.devM.ClearFaults()
			require.NoError(t, req.Append(ctx, 1))
			require.Equal(t, 5, req.Tokens())
			require.NoError(t, s.Close())
			r.audit(t, "end")
		})
	}
}

// Requests sharing a system prompt map one backing read-only; a write into
// it needs PrepareWrite, which copies on write for that request only.
func TestKVPrefixSharedAndCopyOnWrite(t *testing.T) {
	r := newRig(t, 1<<20, 1<<20)
	s := r.kv(t, governor.HolderOptions{}, nil)
	ctx := context.Background()

	sys := bytes.Repeat([]byte("system prompt KV "), 300) // 5100 bytes: 5 tokens, two chunks
	p, err := s.NewPrefix(ctx, 5, sys)
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(2*gran), p.Size)
	r.drain(t)
	require.Equal(t, memapi.Bytes(2*gran), r.charged("kv", devAuth), "the prefix is charged once")

	a, err := s.Admit(ctx, holders.RequestSpec{ID: "a", PromptTokens: 2, MaxTokens: 16, Prefix: p})
	require.NoError(t, err)
	b, err := s.Admit(ctx, holders.RequestSpec{ID: "b", PromptTokens: 2, MaxTokens: 16, Prefix: p})
	require.NoError(t, err)
	r.drain(t)
	require.Equal(t, 2, p.Views())
	require.Equal(t, memapi.Bytes(4*gran), r.charged("kv", devAuth), "prefix once + one chunk per request")
	require.Equal(t, memapi.Bytes(gran), a.Bytes())
	require.True(t, a.Shared())
	require.Equal(t, memapi.Bytes(2*gran), a.TokenOffset(5), "own tokens start after the prefix's chunks")
	require.Equal(t, memapi.Bytes(3*1024), a.TokenOffset(3))

	require.Equal(t, sys, read(t, r.devF, a.Addr(), len(sys)))
	require.Equal(t, sys, read(t, r.devF, b.Addr(), len(sys)))

	// A write into the shared prefix without copy-on-write is refused.
	err = write(t, r.devF, a.Addr()+memapi.DeviceAddr(a.TokenOffset(1)), []byte("mine"))
	require.ErrorIs(t, err, memapi.ErrReadOnly)
	require.Equal(t, sys, read(t, r.devF, b.Addr(), len(sys)))

	// Writing the request's own tokens needs no copy.
	require.NoError(t, a.PrepareWrite(ctx, a.TokenOffset(5), 1024))
	require.True(t, a.Shared())

	require.NoError(t, a.PrepareWrite(ctx, a.TokenOffset(1), 4))
	require.False(t, a.Shared())
	require.NoError(t, write(t, r.devF, a.Addr()+memapi.DeviceAddr(a.TokenOffset(1)), []byte("mine")))
	got := read(t, r.devF, a.Addr(), len(sys))
	require.Equal(t, []byte("mine"), got[1024:1028])
	require.Equal(t, sys[:1024], got[:1024], "the copy kept the prefix's bytes")
	require.Equal(t, sys, read(t, r.devF, b.Addr(), len(sys)), "the other request still sees the shared prefix")
	r.drain(t)
	require.Equal(t, memapi.Bytes(6*gran), r.charged("kv", devAuth), "the copy is charged")
	require.Equal(t, memapi.Bytes(3*gran), a.Bytes())
	require.Equal(t, 1, p.Views())
	require.Equal(t, uint64(1), s.Stats().CopyOnWrites)

	require.ErrorIs(t, a.PrepareWrite(ctx, 0, 1<<20), memapi.ErrInvalidRange)

	// The backing goes when its owner closed it and its last view is gone.
	require.NoError(t, p.Close())
	r.drain(t)
	require.Equal(t, memapi.Bytes(6*gran), r.charged("kv", devAuth), "b still maps the prefix")
	require.NoError(t, b.Finish())
	r.drain(t)
	require.Equal(t, memapi.Bytes(3*gran), r.charged("kv", devAuth))
	require.NoError(t, a.Finish())
	require.NoError(t, s.Close())
	r.audit(t, "end")
	require.Zero(t, r.devM.UsedBytes())
}

// Under a ticket the store preempts the lowest priority first, then the
// request idle longest, then the newest, and stops once the ticket is
// covered. Preempted requests are requeued and reported, never dropped.
func TestKVReclaimVictimChoice(t *testing.T) {
	r := newRig(t, 1<<20, 1<<20)
	var told []string
	s := r.kv(t, governor.HolderOptions{}, func(c *holders.KVConfig) {
		c.OnPreempt = func(q *holders.Request) { told = append(told, q.ID()) }
	})
	ctx := context.Background()
	admit := func(id string, pri, tokens int) *holders.Request {
		q, err := s.Admit(ctx, holders.RequestSpec{ID: id, PromptTokens: tokens, MaxTokens: 64, Priority: pri})
		require.NoError(t, err)
		return q
	}
	hi := admit("hi", 9, 8)       // 2 chunks
	old := admit("old", 5, 4)     // 1 chunk
	newer := admit("new", 5, 4)   // 1 chunk
	low := admit("low", 1, 12)    // 3 chunks
	fresh := admit("fresh", 5, 4) // 1 chunk, newest
	// "old" and "fresh" are idle; "new" steps now, so it was used last.
	require.NoError(t, newer.Append(ctx, 1))
	require.NoError(t, newer.RecordUse(nil))

	// One byte: the lowest priority goes first, whatever its size.
	freed, err := s.Reclaim(ctx, ticket(devAuth, 1))
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(3*gran), freed)
	require.Equal(t, holders.Preempted, low.State())
	require.Equal(t, []string{"low"}, told)

	// Among equal priorities: idle longest first ("old" before "fresh", both
	// before "new"), until the ticket is covered.
	freed, err = s.Reclaim(ctx, ticket(devAuth, 2*gran))
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(2*gran), freed)
	require.Equal(t, []string{"low", "old", "fresh"}, told)
	require.Equal(t, holders.Running, newer.State())
	require.Equal(t, holders.Running, hi.State())

	var ids []string
	for _, q := range s.Requeued() {
		ids = append(ids, q.ID())
	}
	require.Equal(t, []string{"low", "old", "fresh"}, ids, "requeued in preemption order")
	require.ErrorIs(t, old.Append(ctx, 1), holders.ErrPreempted)
	require.ErrorIs(t, old.Append(ctx, 1), memapi.ErrReleased, "a preempted request's calls match memapi.ErrReleased")
	require.Zero(t, old.Addr())
	require.Equal(t, 4, old.Tokens(), "the tokens to recompute are kept")
	r.audit(t, "after preemption")
	require.Equal(t, memapi.Bytes(2*gran+2*gran), r.charged("kv", devAuth))

	st := s.Stats()
	require.Equal(t, uint64(3), st.Preempted)
	require.Equal(t, 2, st.Running)
	require.Equal(t, 3, st.Requeued)
	require.Equal(t, uint64(2), st.Tickets)
	require.Equal(t, memapi.Bytes(5*gran), st.Reclaimed)

	// Resume backs the tokens again and takes the request off the list.
	require.NoError(t, s.Resume(ctx, old))
	require.Equal(t, holders.Running, old.State())
	require.Equal(t, 1, old.Preemptions())
	require.NoError(t, old.Append(ctx, 1))
	require.Equal(t, 5, old.Tokens())
	require.ErrorIs(t, s.Resume(ctx, old), memapi.ErrInUse, "not preempted")
	// Finish of a requeued request is the runtime's explicit drop.
	require.NoError(t, fresh.Finish())
	require.Len(t, s.Requeued(), 1)
	require.NoError(t, s.Close())
	require.Equal(t, holders.Finished, low.State())
	r.audit(t, "end")
	require.Zero(t, r.devM.UsedBytes())
}

// A request whose step is in flight is never preempted: the store answers 0
// until the fence completes.
func TestKVInFlightNeverEvicted(t *testing.T) {
	r := newRig(t, 1<<20, 1<<20)
	s := r.kv(t, governor.HolderOptions{}, nil)
	ctx := context.Background()
	q, err := s.Admit(ctx, holders.RequestSpec{ID: "a", PromptTokens: 8, MaxTokens: 64})
	require.NoError(t, err)

	steps := fakes.NewContext(r.devM) // the "compute" stream, under the test's control
	steps.SetManualFences(true)
	st, err := steps.NewStream()
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Close()); require.NoError(t, steps.Close()) }()
	f, err := st.Record()
	require.NoError(t, err)
	require.NoError(t, q.RecordUse(f))
	require.True(t, q.InFlight())

	freed, err := s.Reclaim(ctx, ticket(devAuth, 1<<20))
	require.NoError(t, err)
	require.Zero(t, freed, "in flight: nothing may be freed")
	require.Equal(t, holders.Running, q.State())
	require.NoError(t, q.PrepareWrite(ctx, 0, 1)) // own tokens, no prefix: nothing to copy

	f.(*fakes.Fence).Complete()
	require.False(t, q.InFlight())
	freed, err = s.Reclaim(ctx, ticket(devAuth, 1<<20))
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(2*gran), freed)
	require.NoError(t, s.Close())
	r.audit(t, "end")
}

// A ticket may be answered with 0: another authority, nothing to free, or
// only a prefix view (which the request does not own).
func TestKVZeroAnswers(t *testing.T) {
	r := newRig(t, 1<<20, 1<<20)
	s := r.kv(t, governor.HolderOptions{}, nil)
	ctx := context.Background()
	freed, err := s.Reclaim(ctx, ticket(devAuth, gran))
	require.NoError(t, err)
	require.Zero(t, freed, "no requests")

	p, err := s.NewPrefix(ctx, 4, nil)
	require.NoError(t, err)
	q, err := s.Admit(ctx, holders.RequestSpec{ID: "a", PromptTokens: 0, MaxTokens: 8, Prefix: p})
	require.NoError(t, err)
	freed, err = s.Reclaim(ctx, ticket(hostAuth, gran))
	require.NoError(t, err)
	require.Zero(t, freed, "another authority")
	freed, err = s.Reclaim(ctx, ticket(devAuth, gran))
	require.NoError(t, err)
	require.Zero(t, freed, "the request owns nothing: preempting it frees nothing")
	require.Equal(t, holders.Running, q.State())
	require.Equal(t, uint64(3), s.Stats().Tickets)
	require.NoError(t, s.Close())
	r.audit(t, "end")
}

// The governor calls Reclaim in the goroutine of a request that waits
// inside Append: another request is preempted and the growth goes through.
// An admission preempts only lower priorities.
func TestKVPressureFromItsOwnGrowth(t *testing.T) {
	r := newRig(t, 4*gran, 1<<20)
	var mu sync.Mutex
	var told []string
	s := r.kv(t, governor.HolderOptions{}, func(c *holders.KVConfig) {
		c.OnPreempt = func(q *holders.Request) { mu.Lock(); told = append(told, q.ID()); mu.Unlock() }
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := s.Admit(ctx, holders.RequestSpec{ID: "a", PromptTokens: 8, MaxTokens: 64, Priority: 5})
	require.NoError(t, err)
	b, err := s.Admit(ctx, holders.RequestSpec{ID: "b", PromptTokens: 8, MaxTokens: 64, Priority: 1})
	require.NoError(t, err)
	// Full: a's next chunk needs b's memory.
	require.NoError(t, a.Append(ctx, 1))
	require.Equal(t, holders.Preempted, b.State())
	require.Equal(t, []string{"b"}, told)
	require.Equal(t, 9, a.Tokens())
	a0, _ := r.g.Authority(devAuth)
	require.NotZero(t, a0.Tickets)

	// Resuming b (2 chunks) beside a (3 chunks) does not fit in 4, and an
	// admission does not preempt a higher priority: it waits, then fails,
	// leaving b requeued and a untouched.
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	err = s.Resume(short, b)
	cancelShort()
	require.ErrorIs(t, err, memapi.ErrOverBudget)
	require.Equal(t, holders.Running, a.State())
	require.Equal(t, holders.Preempted, b.State())
	require.Len(t, s.Requeued(), 1)
	require.NoError(t, s.Close())
	r.audit(t, "end")
	require.Zero(t, r.devM.UsedBytes())
}

// Two requests grow concurrently against a full budget, each waiting inside
// Append for memory only the other holds. Neither may wait forever: the
// ticket of one preempts the other (cancelling its wait), which returns
// ErrPreempted, and the survivor finishes. Repeated with Resume.
func TestKVConcurrentGrowthNeverDeadlocks(t *testing.T) {
	r := newRig(t, 6*gran, 1<<20)
	s := r.kv(t, governor.HolderOptions{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var reqs []*holders.Request
	for _, id := range []string{"a", "b"} {
		q, err := s.Admit(ctx, holders.RequestSpec{ID: id, PromptTokens: 8, MaxTokens: 64})
		require.NoError(t, err)
		reqs = append(reqs, q)
	}
	preempted := 0
	for round := range 20 {
		var wg sync.WaitGroup
		errs := make([]error, len(reqs))
		for i, q := range reqs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for q.Tokens() < 16 {
					if err := q.Append(ctx, 1); err != nil {
						errs[i] = err
						return
					}
				}
			}()
		}
		wg.Wait()
		survivors := 0
		for i, q := range reqs {
			if err := errs[i]; err != nil {
				require.True(t, errors.Is(err, holders.ErrPreempted), "round %d: %v", round, err)
			}
			if q.State() == holders.Preempted {
				preempted++
				continue
			}
			survivors++
			require.Equal(t, 16, q.Tokens())
		}
		// 8 chunks cannot fit in 6: one was preempted, idle after its growth
		// or busy inside it.
		require.Equal(t, 1, survivors, "round %d", round)
		r.audit(t, "round")
		// Start again: everyone back to 8 tokens.
		for i, q := range reqs {
			require.NoError(t, q.Finish())
			q, err := s.Admit(ctx, holders.RequestSpec{ID: q.ID(), PromptTokens: 8, MaxTokens: 64})
			require.NoError(t, err)
			reqs[i] = q
		}
	}
	require.Equal(t, 20, preempted)
	require.NoError(t, s.Close())
	r.audit(t, "end")
	require.Zero(t, r.devM.UsedBytes())
}

// A request waiting inside Append is preempted by cancelling its wait when
// another request's ticket chooses it; its Append returns ErrPreempted and
// its memory goes to the asker.
func TestKVBusyRequestPreemptedByCancellingItsWait(t *testing.T) {
	r := newRig(t, 4*gran, 1<<20)
	var told []string
	var mu sync.Mutex
	s := r.kv(t, governor.HolderOptions{}, func(c *holders.KVConfig) {
		c.OnPreempt = func(q *holders.Request) { mu.Lock(); told = append(told, q.ID()); mu.Unlock() }
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := s.Admit(ctx, holders.RequestSpec{ID: "a", PromptTokens: 8, MaxTokens: 64})
	require.NoError(t, err)
	b, err := s.Admit(ctx, holders.RequestSpec{ID: "b", PromptTokens: 8, MaxTokens: 64})
	require.NoError(t, err)

	steps := fakes.NewContext(r.devM)
	steps.SetManualFences(true)
	st, err := steps.NewStream()
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Close()); require.NoError(t, steps.Close()) }()
	f, err := st.Record()
	require.NoError(t, err)
	require.NoError(t, a.RecordUse(f))

	// b needs a chunk; a is in flight, so b's ticket frees 0 and b waits.
	done := make(chan error, 1)
	go func() { done <- b.Append(ctx, 1) }()
	require.Eventually(t, func() bool { a0, _ := r.g.Authority(devAuth); return a0.Waiters == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, holders.Running, a.State())

	// a's step completes and a grows: its ticket preempts b, busy waiting.
	f.(*fakes.Fence).Complete()
	require.NoError(t, a.Append(ctx, 1))
	err = <-done
	require.True(t, errors.Is(err, holders.ErrPreempted), "%v", err)
	require.Equal(t, holders.Preempted, b.State())
	require.Equal(t, 8, b.Tokens(), "the failed growth changed nothing")
	require.Equal(t, []string{"b"}, told)
	require.Equal(t, 9, a.Tokens())
	r.audit(t, "after")

	// Alone, a request whose growth nothing else can cover waits (it never
	// preempts itself) and fails by its context, unchanged.
	require.NoError(t, a.Append(ctx, 3)) // 12 tokens: 3 chunks
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	err = a.Append(short, 8) // 5 chunks > 4
	cancelShort()
	require.ErrorIs(t, err, memapi.ErrOverBudget)
	require.Equal(t, holders.Running, a.State())
	require.Equal(t, 12, a.Tokens())

	// The runtime may preempt a request itself.
	require.NoError(t, a.Preempt())
	require.Equal(t, []string{"b", "a"}, told)
	require.ErrorIs(t, a.Preempt(), holders.ErrPreempted)
	require.NoError(t, s.Resume(ctx, b))
	require.NoError(t, s.Close())
	r.audit(t, "end")
	require.Zero(t, r.devM.UsedBytes())
}

// An admission preempts only requests of a lower priority than its own:
// admitting never evicts its equals.
func TestKVAdmissionPreemptsOnlyLowerPriorities(t *testing.T) {
	r := newRig(t, 4*gran, 1<<20)
	s := r.kv(t, governor.HolderOptions{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	low, err := s.Admit(ctx, holders.RequestSpec{ID: "low", PromptTokens: 8, MaxTokens: 64, Priority: 1})
	require.NoError(t, err)
	mid, err := s.Admit(ctx, holders.RequestSpec{ID: "mid", PromptTokens: 8, MaxTokens: 64, Priority: 2})
	require.NoError(t, err)

	short, cancelShort := context.WithTimeout(ctx, 30*time.Millisecond)
	_, err = s.Admit(short, holders.RequestSpec{ID: "peer", PromptTokens: 8, MaxTokens: 64, Priority: 1})
	cancelShort()
	require.ErrorIs(t, err, memapi.ErrOverBudget, "an equal does not preempt low")
	require.Equal(t, holders.Running, low.State())
	r.audit(t, "refused")

	high, err := s.Admit(ctx, holders.RequestSpec{ID: "high", PromptTokens: 8, MaxTokens: 64, Priority: 3})
	require.NoError(t, err)
	require.Equal(t, holders.Preempted, low.State(), "the lowest priority makes room")
	require.Equal(t, holders.Running, mid.State())
	require.Equal(t, holders.Running, high.State())
	require.Equal(t, "preempted", low.State().String())
	require.NoError(t, s.Close())
	r.audit(t, "end")
}
