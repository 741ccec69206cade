package ep_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/stretchr/testify/require"
)

// Bug 11: an onClose that panicked wedged the queue (the queued Free
// waited forever for the marking). Now the release is still queued and
// runs, and the panic goes on to Close's caller.
func TestPanickingOnCloseStillReleases(t *testing.T) {
	c, _ := newCtx(t)
	var freed atomic.Bool
	o, err := c.Own("buf", &releaser{pending: func() { panic("hook bug") }, free: func(context.Context) error { freed.Store(true); return nil }})
	require.NoError(t, err)
	require.PanicsWithValue(t, "hook bug", func() { _ = o.Close() })
	drain(t, c)
	require.True(t, freed.Load())
	require.Zero(t, c.Live())
	require.Equal(t, ep.Released, o.State())
	// Later releases on the context still run.
	o2, err := c.Own("next", &releaser{free: func(context.Context) error { return nil }})
	require.NoError(t, err)
	require.NoError(t, o2.Close())
	drain(t, c)
	require.Zero(t, c.Live())
}

// A panicking Free is recovered on the queue: the handle is quarantined,
// the queue runs on.
func TestPanickingFreeQuarantines(t *testing.T) {
	c, _ := newCtx(t)
	var boom atomic.Bool
	boom.Store(true)
	o, err := c.Own("buf", &releaser{free: func(context.Context) error {
		if boom.Load() {
			panic("free bug")
		}
		return nil
	}})
	require.NoError(t, err)
	require.NoError(t, o.Close())
	drain(t, c)
	require.Equal(t, ep.Quarantined, o.State())
	require.ErrorIs(t, o.Err(), ep.ErrQuarantined)
	require.Contains(t, o.Err().Error(), "free bug")
	require.Equal(t, 1, c.Live())
	require.Equal(t, 1, c.Quarantined())
	boom.Store(false)
	require.NoError(t, o.Retry())
	drain(t, c)
	require.Equal(t, ep.Released, o.State())
	require.Zero(t, c.Live())
	require.Zero(t, c.Quarantined())
}

// Also: Queue().Close() succeeded while handles were pinned, after which
// they could never be released.
func TestQueueRefusesToCloseWhilePinned(t *testing.T) {
	c, _ := newCtx(t)
	var freed atomic.Bool
	o, err := c.Own("buf", &releaser{free: func(context.Context) error { freed.Store(true); return nil }})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	err = c.Queue().Close(ctx)
	require.ErrorIs(t, err, memapi.ErrInUse)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, o.Close())
	drain(t, c)
	require.True(t, freed.Load(), "the handle could not be released")
}

// A transaction holds the handle open: Close during it returns at once and
// the release waits for its end; Begin after Close fails.
func TestCloseDuringATransactionWaitsForIt(t *testing.T) {
	c, _ := newCtx(t)
	var pending, freed atomic.Bool
	o, err := c.Own("r", &releaser{pending: func() { pending.Store(true) }, free: func(context.Context) error { freed.Store(true); return nil }})
	require.NoError(t, err)
	l := o.Lifecycle()
	require.NoError(t, l.Begin("txn"))
	require.NoError(t, o.Close())
	require.Equal(t, ep.Closing, o.State())
	require.ErrorIs(t, l.Begin("later"), memapi.ErrClosed)
	drain(t, c)
	require.False(t, pending.Load(), "marked pending during the transaction")
	require.False(t, freed.Load(), "freed during the transaction")
	f := newFence(false)
	require.NoError(t, l.End(f)) // the transaction queued work behind f
	require.True(t, pending.Load())
	time.Sleep(2 * time.Millisecond)
	require.False(t, freed.Load(), "freed before the transaction's fence")
	f.Complete()
	drain(t, c)
	require.True(t, freed.Load())
	require.Equal(t, ep.Released, o.State())
}

// Behaviour: the free never runs before the handle is marked pending.
func TestFreeRunsOnlyAfterPendingIsMarked(t *testing.T) {
	c, _ := newCtx(t)
	var early atomic.Bool
	for range 50 {
		marked := new(atomic.Bool)
		o, err := c.Own("buf", &releaser{pending: func() { time.Sleep(100 * time.Microsecond); marked.Store(true) }, free: func(context.Context) error {
			if !marked.Load() {
				early.Store(true)
			}
			return nil
		}})
		require.NoError(t, err)
		require.NoError(t, o.Close())
	}
	drain(t, c)
	require.False(t, early.Load(), "a free ran before its handle was marked pending")
}

// Behaviour: compaction of the recorded fences drops only completed ones.
func TestRecordUseKeepsFencesInFlight(t *testing.T) {
	c, _ := newCtx(t)
	var freed atomic.Bool
	o, err := c.Own("buf", &releaser{free: func(context.Context) error { freed.Store(true); return nil }})
	require.NoError(t, err)
	inFlight := newFence(false)
	require.NoError(t, o.RecordUse(inFlight))
	for range 20 {
		f := newFence(false)
		f.Complete()
		require.NoError(t, o.RecordUse(f))
	}
	require.Len(t, o.Pending(), 1)
	require.NoError(t, o.Close())
	time.Sleep(5 * time.Millisecond)
	require.False(t, freed.Load(), "freed before a fence in flight completed")
	inFlight.Complete()
	drain(t, c)
	require.True(t, freed.Load())
}

// Releases that depend on each other are ordered by a Completion, never by
// one Free waiting for another.
func TestCompletionOrdersReleases(t *testing.T) {
	q := ep.NewQueue(ep.Options{})
	defer func() { require.NoError(t, q.Close(context.Background())) }()
	f := newFence(true)
	first := ep.NewCompletion()
	var order []string
	done := make(chan struct{})
	require.NoError(t, q.Enqueue(ep.Release{Name: "first", Fences: []memapi.Fence{f}, Done: first,
		Free: func(context.Context) error { order = append(order, "first"); return errors.New("fails") }}))
	require.NoError(t, q.Enqueue(ep.Release{Name: "second", Fences: []memapi.Fence{first},
		Free: func(context.Context) error { order = append(order, "second"); close(done); return nil }}))
	time.Sleep(2 * time.Millisecond)
	require.Empty(t, order)
	f.Complete()
	watchdog.Recv(t, watchdog.Bound, "the releases", done)
	require.Equal(t, []string{"first", "second"}, order, "a failed release completes too")
}

// Queue.Close saw no pins, and a handle made just then (before closing was
// set) had its release refused once closing was set: quarantined, its
// context pinned by a queue that could never release it. Now Close re-checks
// the pins with the flag in one step: the new handle's release is accepted
// and runs, and Close waits for it.
func TestHandleMadeAsTheQueueClosesIsReleased(t *testing.T) {
	c, _ := newCtx(t)
	q := c.Queue()
	var (
		h       *ep.Owned
		ownErr  error
		made    bool
		freed   atomic.Bool
		waiting = make(chan struct{}, 1)
	)
	ep.SetCloseHook(q, func(s ep.CloseStep) {
		switch s {
		case ep.StepPinsZero: // the window: pins seen at zero, closing not set
			if !made {
				made = true
				h, ownErr = c.Own("late", &releaser{free: func(context.Context) error { freed.Store(true); return nil }})
			}
		case ep.StepWaitPins:
			select {
			case waiting <- struct{}{}:
			default:
			}
		}
	})
	errc := make(chan error, 1)
	go func() { errc <- q.Close(context.Background()) }()
	var closeErr error
	returned := false
	select {
	case <-waiting: // Close saw the new pin and waits for it
	case closeErr = <-errc:
		returned = true
	}
	require.NoError(t, ownErr)
	require.NoError(t, h.Close(), "the release of a handle made as the queue closed was refused")
	if !returned {
		closeErr = watchdog.Recv(t, watchdog.Bound, "the queue's Close", errc)
	}
	require.NoError(t, closeErr)
	require.True(t, freed.Load())
	require.Equal(t, ep.Released, h.State())
	require.Zero(t, c.Quarantined())
	require.Zero(t, c.Live())
}

// While Queue.Close drains (closing set, a release still waits for its
// fence), a new handle of the owning context is refused with
// memapi.ErrClosed: its release could never be scheduled.
func TestOwnWhileTheQueueDrainsIsRefused(t *testing.T) {
	c, _ := newCtx(t)
	q := c.Queue()
	f := newFence(false)
	require.NoError(t, q.Enqueue(ep.Release{Name: "pending", Fences: []memapi.Fence{f}, Free: func(context.Context) error { return nil }}))
	var (
		h      *ep.Owned
		ownErr error
	)
	ep.SetCloseHook(q, func(s ep.CloseStep) {
		if s == ep.StepClosing {
			h, ownErr = c.Own("late", &releaser{free: func(context.Context) error { return nil }})
			f.Complete()
		}
	})
	require.NoError(t, q.Close(context.Background()))
	if h != nil {
		_ = h.Close()
	}
	require.ErrorIs(t, ownErr, memapi.ErrClosed)
	require.Zero(t, c.Quarantined())
	require.Zero(t, c.Live())
}

// Memory no handle owns any more (a failed rollback) is held by a
// lifecycle born quarantined: it pins the context, is listed with its
// cause, and RetryQuarantined frees it.
func TestOwnQuarantinedIsRetried(t *testing.T) {
	c, _ := newCtx(t)
	var fail atomic.Bool
	fail.Store(true)
	cause := errors.New("rollback failed")
	l, err := c.OwnQuarantined("left", &releaser{free: func(context.Context) error {
		if fail.Load() {
			return errors.New("still failing")
		}
		return nil
	}}, cause)
	require.NoError(t, err)
	require.Equal(t, ep.Quarantined, l.State())
	require.Equal(t, 1, c.Live())
	require.Equal(t, 1, c.Quarantined())
	require.ErrorIs(t, c.QuarantineErrors()[0], cause)
	require.ErrorIs(t, c.Close(context.Background(), false), memapi.ErrInUse)
	require.NoError(t, c.RetryQuarantined())
	drain(t, c)
	require.Equal(t, ep.Quarantined, l.State(), "a failing retry keeps it")
	fail.Store(false)
	require.NoError(t, c.RetryQuarantined())
	drain(t, c)
	require.Equal(t, ep.Released, l.State())
	require.Zero(t, c.Live())
	require.Zero(t, c.Quarantined())
}

// A leftover the context refuses to pin (closed, or its queue closing) is
// kept all the same: listed with its cause and the refusal, pinning
// nothing (Close is not held), and RetryQuarantined frees it in the
// caller's goroutine once the queue no longer takes releases; a retry that
// fails keeps it listed.
func TestOwnQuarantinedOnAClosingContextIsKept(t *testing.T) {
	for _, when := range []string{"closed", "queue-closing"} {
		t.Run(when, func(t *testing.T) {
			c, _ := newCtx(t)
			var fail atomic.Bool
			var frees atomic.Int32
			fail.Store(true)
			cause := errors.New("rollback failed")
			r := &releaser{free: func(context.Context) error {
				frees.Add(1)
				if fail.Load() {
					return errors.New("still failing")
				}
				return nil
			}}
			var l *ep.Lifecycle
			own := func() {
				var err error
				l, err = c.OwnQuarantined("left", r, cause)
				require.NoError(t, err)
			}
			if when == "closed" {
				require.NoError(t, c.Close(context.Background(), false))
				own()
			} else {
				ep.SetCloseHook(c.Queue(), func(s ep.CloseStep) {
					if s == ep.StepClosing {
						own()
					}
				})
				require.NoError(t, c.Close(context.Background(), false), "an unpinned leftover does not hold Close")
			}
			require.Equal(t, ep.Quarantined, l.State())
			require.Zero(t, c.Live(), "it pins nothing")
			require.Equal(t, 1, c.Quarantined())
			require.Len(t, c.Handles(), 1, "Handles lists the unpinned leftover")
			require.Equal(t, "left", c.Handles()[0].Name())
			require.ErrorIs(t, c.QuarantineErrors()[0], cause)
			require.ErrorIs(t, c.QuarantineErrors()[0], memapi.ErrClosed, "the refusal is named")
			require.NoError(t, c.RetryQuarantined())
			require.Equal(t, int32(1), frees.Load(), "run at once, the queue being closed")
			require.Equal(t, ep.Quarantined, l.State(), "a failing retry keeps it")
			require.Equal(t, 1, c.Quarantined())
			fail.Store(false)
			require.NoError(t, c.RetryQuarantined())
			require.Equal(t, ep.Released, l.State())
			require.Zero(t, c.Quarantined())
			require.Empty(t, c.Handles())
			require.Zero(t, c.Live(), "no unpin without a pin")
			st := c.Queue().Stats()
			require.Equal(t, uint64(1), st.Failed)
			require.Equal(t, uint64(1), st.Freed)
		})
	}
}

// releaser is a test's ep.Releaser: pending (optional) runs at Pending,
// free at Free.
type releaser struct {
	pending func()
	free    func(context.Context) error
}

func (r *releaser) Closed() {}
func (r *releaser) Pending() {
	if r.pending != nil {
		r.pending()
	}
}
func (r *releaser) Free(ctx context.Context) error { return r.free(ctx) }

// Two Closes of one queue, the second while the first drains: both return
// nil and the queue stops once (the second stop panicked: close of a closed
// channel).
func TestQueueClosedTwiceAtOnce(t *testing.T) {
	c, _ := newCtx(t)
	q := c.Queue()
	nested := false
	var inner error
	ep.SetCloseHook(q, func(s ep.CloseStep) {
		if s == ep.StepClosing && !nested {
			nested = true
			inner = q.Close(context.Background())
		}
	})
	require.NotPanics(t, func() { require.NoError(t, q.Close(context.Background())) })
	require.NoError(t, inner)
	require.ErrorIs(t, q.Enqueue(ep.Release{Name: "late", Free: func(context.Context) error { return nil }}), memapi.ErrClosed)
}

// Handles names every handle that still holds the context: open,
// quarantined, and the unpinned leftovers; a released one is gone.
func TestHandlesNamesWhatStillHoldsTheContext(t *testing.T) {
	c, _ := newCtx(t)
	names := func() []string {
		var out []string
		for _, l := range c.Handles() {
			out = append(out, l.Name()+":"+l.State().String())
		}
		return out
	}
	a, err := c.Own("a", &releaser{free: func(context.Context) error { return nil }})
	require.NoError(t, err)
	var fail atomic.Bool
	fail.Store(true)
	b, err := c.Own("b", &releaser{free: func(context.Context) error {
		if fail.Load() {
			return errors.New("device busy")
		}
		return nil
	}})
	require.NoError(t, err)
	d, err := c.Own("d", &releaser{free: func(context.Context) error { return nil }})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"a:open", "b:open", "d:open"}, names())
	require.NoError(t, b.Close())
	require.NoError(t, d.Close())
	drain(t, c)
	require.ElementsMatch(t, []string{"a:open", "b:quarantined"}, names())
	fail.Store(false)
	require.NoError(t, b.Retry())
	require.NoError(t, a.Close())
	drain(t, c)
	require.Empty(t, names())
	require.Zero(t, c.Live())
}

// Own without a releaser is a typed error and pins nothing: the context
// closes at once.
func TestOwnWithoutReleaserIsRefused(t *testing.T) {
	c, _ := newCtx(t)
	o, err := c.Own("nothing", nil)
	require.ErrorIs(t, err, memapi.ErrInvalidSize)
	require.Nil(t, o)
	require.Zero(t, c.Live())
	require.NoError(t, c.Close(context.Background(), false))
}
