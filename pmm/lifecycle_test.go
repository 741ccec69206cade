package pmm_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/pmm"
	"github.com/stretchr/testify/require"
)

const gran = 65536

// settled checks the identity at quiescence: nothing charged, held or
// pinned, after the queue drained.
func (e *env) settled(t *testing.T) {
	t.Helper()
	e.drain(t)
	require.Equal(t, figures{}, e.l.snapshot(), "ledger")
	require.Zero(t, e.m.UsedBytes(), "mechanism")
	require.Zero(t, e.ectx.Live(), "context pins")
}

// gcUntil runs the collector until cond holds (the backstop runs cleanups
// on its own goroutine).
func gcUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	require.True(t, cond(), "the backstop did not run")
}

// Bug 1: a Region dropped without Close was never released (its cleanup's
// argument reached the Region).
func TestDroppedRegionIsReleased(t *testing.T) {
	e := setup(t, fakes.Config{})
	b := e.bind(t, "kv", "cache")
	before := ep.Leaks()
	func() {
		r, err := b.ReserveVirtual(context.Background(), 4*gran)
		require.NoError(t, err)
		require.NoError(t, r.Grow(context.Background(), 2*gran, nil))
	}()
	gcUntil(t, func() bool { return e.ectx.Live() == 0 })
	e.settled(t)
	require.Greater(t, ep.Leaks(), before)
	require.NoError(t, b.Close(), "the backstop settles the binding's live count")
}

// Bug 1, for a shared backing with a view still mapped: the view holds it;
// once the region goes too, both are released.
func TestDroppedSharedIsReleasedAfterItsViews(t *testing.T) {
	e := setup(t, fakes.Config{})
	b := e.bind(t, "p", "kv")
	ctx := context.Background()
	r, err := b.ReserveVirtual(ctx, 4*gran)
	require.NoError(t, err)
	func() {
		sh, err := b.CreateShared(ctx, gran)
		require.NoError(t, err)
		_, err = r.MapShared(ctx, sh, memapi.AccessReadOnly)
		require.NoError(t, err)
	}()
	gcUntil(t, func() bool { return b.Live() == 1 })
	e.drain(t)
	require.Equal(t, figures{Charged: gran}, e.l.snapshot(), "freed under a live view")
	require.NoError(t, r.Close())
	e.settled(t)
	require.NoError(t, b.Close())
}

// Bug 2: a Buffer released by the backstop stayed counted live in its
// binding, so Binding.Close failed forever.
func TestDroppedBufferSettlesTheBinding(t *testing.T) {
	e := setup(t, fakes.Config{})
	b := e.bind(t, "h", "r")
	func() {
		_, err := b.Allocate(context.Background(), 4096)
		require.NoError(t, err)
	}()
	gcUntil(t, func() bool { return e.m.FreeCallCount() == 1 })
	e.settled(t)
	require.Zero(t, b.Live())
	require.NoError(t, b.Close())
}

// Bug 3: Region.Close while Grow's update runs: the release freed the range
// just committed, then Grow committed the charge.
func TestCloseDuringGrowReleasesWhatGrowCommitted(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	b, r := e.region(t, 8*gran)
	require.NoError(t, r.Grow(ctx, gran, nil))
	require.NoError(t, r.Grow(ctx, 4*gran, func(memapi.Bytes) error {
		require.NoError(t, r.Close())
		e.drain(t) // a release that does not wait for the transaction runs now
		return nil
	}))
	e.settled(t)
	require.ErrorIs(t, r.Grow(ctx, 5*gran, nil), memapi.ErrClosed)
	require.NoError(t, b.Close())
}

// Bug 4: Region.Close during MapShared left the view mapped and the
// backing never freed.
func TestCloseDuringMapSharedReleasesTheView(t *testing.T) {
	e := setup(t, fakes.Config{})
	b := e.bind(t, "p", "kv")
	ctx := context.Background()
	sh, err := b.CreateShared(ctx, gran)
	require.NoError(t, err)
	r, err := b.ReserveVirtual(ctx, 4*gran)
	require.NoError(t, err)
	e.m.Inject(fakes.Fault{Method: "MapView", Err: errInjected, When: func(fakes.Call) bool {
		require.NoError(t, r.Close())
		e.drain(t) // a release that does not wait for the transaction runs now
		return false
	}})
	_, err = r.MapShared(ctx, sh, memapi.AccessReadOnly)
	require.NoError(t, err)
	e.m.ClearFaults()
	require.NoError(t, sh.Close())
	e.settled(t)
	require.Zero(t, sh.Views())
}

// Bug 5: Region.Close during Shrink panicked with the region's lock held.
func TestCloseDuringShrink(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	_, r := e.region(t, 8*gran)
	require.NoError(t, r.Grow(ctx, 4*gran, nil))
	require.NoError(t, r.Shrink(ctx, gran, func(memapi.Bytes) error {
		require.NoError(t, r.Close())
		return nil
	}))
	e.settled(t)
}

// flipFence completes for every look after the first once armed: the
// instant a fence completes between two looks of one pass of the queue.
type flipFence struct {
	armed atomic.Bool
	looks atomic.Int32
	ch    chan struct{}
	once  sync.Once
}

func (f *flipFence) Done() bool {
	if !f.armed.Load() {
		return false
	}
	return f.looks.Add(1) > 1
}
func (f *flipFence) Ready() <-chan struct{} { return f.ch }
func (f *flipFence) Wait(ctx context.Context) error {
	select {
	case <-f.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (f *flipFence) complete() { f.once.Do(func() { f.armed.Store(true); close(f.ch) }) }

// Bug 6: Shrink then Close deadlocked the queue when one pass saw the
// fence pending for the shrink's release and complete for the close's: the
// close's release waited inside the queue's goroutine for the shrink's.
func TestShrinkThenCloseNeverBlocksTheQueue(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	_, r := e.region(t, 8*gran)
	require.NoError(t, r.Grow(ctx, 4*gran, nil))
	f := &flipFence{ch: make(chan struct{})}
	require.NoError(t, r.RecordUse(f))
	require.NoError(t, r.Shrink(ctx, gran, nil))
	f.armed.Store(true)
	require.NoError(t, r.Close())
	time.Sleep(5 * time.Millisecond)
	f.complete()
	e.settled(t)
}

// Bug 7: a Grow rollback whose Decommit failed kept the bytes drawn in a
// grant nobody kept: reserved forever, a re-grow failed, the context stayed
// pinned. Now the range is quarantined, visible, and removed by the next
// Grow.
func TestGrowRollbackThatFailsIsQuarantined(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	_, r := e.region(t, 8*gran)
	require.NoError(t, r.Grow(ctx, gran, nil))
	e.l.failCommit = e.l.commits + 1
	e.m.Inject(fakes.Fault{Method: "Decommit", Nth: e.m.DecommitCallCount() + 1, Err: memapi.ErrUnavailable})
	err := r.Grow(ctx, 3*gran, nil)
	require.ErrorIs(t, err, ep.ErrQuarantined)
	require.ErrorIs(t, err, errInjected)
	require.Equal(t, memapi.Bytes(gran), r.Len())
	require.Equal(t, memapi.Bytes(2*gran), r.Quarantined())
	require.Equal(t, memapi.Bytes(3*gran), e.m.UsedBytes())
	require.Equal(t, figures{Charged: 3 * gran, Quarantined: 2 * gran}, e.l.snapshot(), "the bytes stay charged and visible")
	e.m.ClearFaults()
	require.NoError(t, r.Grow(ctx, 4*gran, nil), "the re-grow removes the quarantined range first")
	require.Zero(t, r.Quarantined())
	require.Equal(t, figures{Charged: 4 * gran}, e.l.snapshot())
	require.NoError(t, r.Close())
	e.settled(t)
}

// Bug 7, when the grant cannot be committed either: the open grant keeps
// the drawn bytes (reserved, visible) and Close removes them.
func TestGrowRollbackThatFailsKeepsTheGrant(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	_, r := e.region(t, 8*gran)
	e.l.failCommit = -1 // every commit fails
	e.m.Inject(fakes.Fault{Method: "Decommit", Err: memapi.ErrUnavailable})
	err := r.Grow(ctx, 2*gran, nil)
	require.ErrorIs(t, err, ep.ErrQuarantined)
	require.Equal(t, figures{Reserved: 2 * gran, Drawn: 2 * gran}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(2*gran), r.Quarantined())
	// A failing retry keeps everything; a later one frees it.
	require.ErrorIs(t, r.Retry(ctx), ep.ErrQuarantined)
	e.m.ClearFaults()
	require.NoError(t, r.Close())
	e.settled(t)
}

// Bug 8: a failed Shrink release left its bytes pending forever and the
// range could never be grown again.
func TestFailedShrinkReleaseIsQuarantinedAndRetried(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	_, r := e.region(t, 8*gran)
	require.NoError(t, r.Grow(ctx, 4*gran, nil))
	e.m.Inject(fakes.Fault{Method: "Decommit", Err: memapi.ErrUnavailable})
	require.NoError(t, r.Shrink(ctx, gran, nil))
	e.drain(t)
	require.Equal(t, figures{Charged: 4 * gran, Quarantined: 3 * gran}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(3*gran), r.Quarantined())
	err := r.Grow(ctx, 2*gran, nil)
	require.ErrorIs(t, err, ep.ErrQuarantined, "a grow over a quarantined range fails while its removal fails")
	require.Equal(t, memapi.Bytes(gran), r.Len())
	e.m.ClearFaults()
	require.NoError(t, r.Grow(ctx, 2*gran, nil))
	require.Equal(t, figures{Charged: 2 * gran}, e.l.snapshot())
	require.NoError(t, r.Close())
	e.settled(t)
}

// A buffer whose memory was freed but whose refund failed is quarantined
// with its bytes still charged (visible); the retry finds the memory freed
// and refunds the quarantined bytes, so the ledger is exact again.
func TestBufferRefundFailureIsRetried(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	b := e.bind(t, "w", "weights")
	buf, err := b.Allocate(ctx, 4096)
	require.NoError(t, err)
	e.l.mu.Lock()
	e.l.refunds, e.l.failRefundIf = 0, func(int) bool { return true }
	e.l.mu.Unlock()
	require.NoError(t, buf.Close())
	e.drain(t)
	require.Equal(t, ep.Quarantined, buf.State())
	require.Zero(t, e.m.UsedBytes(), "the memory was freed")
	require.Equal(t, figures{Charged: 4096, Quarantined: 4096}, e.l.snapshot(), "its bytes stay charged until the refund")
	e.l.mu.Lock()
	e.l.failRefundIf = nil
	e.l.mu.Unlock()
	require.NoError(t, e.ectx.RetryQuarantined())
	e.drain(t)
	require.Equal(t, ep.Released, buf.State())
	e.settled(t)
}

// A failed final release quarantines the whole region: visible, pinned,
// and freed by Close (or Retry) once the mechanism recovers.
func TestFailedCloseIsQuarantinedAndRetried(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	b, r := e.region(t, 8*gran)
	require.NoError(t, r.Grow(ctx, 2*gran, nil))
	buf, err := b.Allocate(ctx, 4096)
	require.NoError(t, err)
	e.m.Inject(fakes.Fault{Method: "Decommit", Err: memapi.ErrUnavailable})
	e.m.Inject(fakes.Fault{Method: "Free", Err: memapi.ErrUnavailable})
	require.NoError(t, r.Close())
	require.NoError(t, buf.Close())
	e.drain(t)
	require.Equal(t, ep.Quarantined, r.State())
	require.Equal(t, ep.Quarantined, buf.State())
	require.ErrorIs(t, r.Err(), ep.ErrQuarantined)
	require.Equal(t, figures{Charged: 2*gran + 4096, Quarantined: 2*gran + 4096}, e.l.snapshot())
	require.Equal(t, 2, e.ectx.Quarantined())
	require.ErrorIs(t, e.ectx.Close(ctx, false), memapi.ErrInUse)
	e.m.ClearFaults()
	require.NoError(t, r.Close(), "Close of a quarantined handle retries")
	require.NoError(t, buf.Retry())
	e.settled(t)
	require.Equal(t, ep.Released, r.State())
	require.Zero(t, e.ectx.Quarantined())
}

// Bug 9: CopyOnWrite whose grant commit failed and whose undo MapView
// failed too returned before cancelling the grant, and the segment kept a
// view that was already unmapped.
func TestCopyOnWriteUndoThatFailsLeavesNothingBehind(t *testing.T) {
	e := setup(t, fakes.Config{})
	b := e.bind(t, "p", "kv")
	ctx := context.Background()
	sh, err := b.CreateShared(ctx, gran)
	require.NoError(t, err)
	r, err := b.ReserveVirtual(ctx, 4*gran)
	require.NoError(t, err)
	_, err = r.MapShared(ctx, sh, memapi.AccessReadOnly)
	require.NoError(t, err)
	e.l.failCommit = e.l.commits + 1
	e.m.Inject(fakes.Fault{Method: "MapView", Err: memapi.ErrUnavailable})
	err = r.CopyOnWrite(ctx, 0)
	require.ErrorIs(t, err, errInjected)
	require.ErrorIs(t, err, memapi.ErrUnavailable)
	e.m.ClearFaults()
	require.Equal(t, figures{Charged: gran}, e.l.snapshot(), "the grant went back")
	require.Zero(t, sh.Views(), "the shared reference of the unmapped view was dropped")
	require.NoError(t, r.Close())
	require.NoError(t, sh.Close())
	e.settled(t)
}

// A panicking update rolls Grow back (mechanism and ledger), then panics on.
func TestPanickingGrowUpdateRollsBack(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	b, r := e.region(t, 8*gran)
	require.NoError(t, r.Grow(ctx, gran, nil))
	before := e.state(b)
	require.PanicsWithValue(t, "holder bug", func() {
		_ = r.Grow(ctx, 3*gran, func(memapi.Bytes) error { panic("holder bug") })
	})
	require.Equal(t, before, e.state(b))
	require.Equal(t, memapi.Bytes(gran), r.Len())
	require.PanicsWithValue(t, "holder bug", func() {
		_ = r.Shrink(ctx, 0, func(memapi.Bytes) error { panic("holder bug") })
	})
	require.Equal(t, before, e.state(b))
	require.NoError(t, r.Grow(ctx, 2*gran, nil), "the region is not wedged")
	require.NoError(t, r.Close())
	e.settled(t)
}

// A transaction waiting for its turn when Close comes fails cleanly.
func TestTransactionQueuedBehindCloseFails(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	_, r := e.region(t, 8*gran)
	in, out := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- r.Grow(ctx, gran, func(memapi.Bytes) error { close(in); <-out; return nil })
	}()
	watchdog.Recv(t, watchdog.Bound, "the first Grow's update", in)
	second := make(chan error, 1)
	go func() { second <- r.Grow(ctx, 2*gran, nil) }()
	time.Sleep(5 * time.Millisecond) // let it queue for its turn
	require.NoError(t, r.Close())
	close(out)
	require.ErrorIs(t, watchdog.Recv(t, watchdog.Bound, "the second Grow", second), memapi.ErrClosed)
	// The first Grow ends its transaction after the second learns it
	// lost: only then is the region's release scheduled, so wait for it
	// before the queue is drained.
	require.NoError(t, watchdog.Recv(t, watchdog.Bound, "the first Grow", first))
	e.settled(t)
}

// Manager.Close closes the bindings, waits for the releases and reports
// what is still live.
func TestManagerClose(t *testing.T) {
	e := setup(t, fakes.Config{})
	b := e.bind(t, "h", "r")
	ctx := context.Background()
	buf, err := b.Allocate(ctx, 4096)
	require.NoError(t, err)
	idle := e.bind(t, "idle", "r")
	err = e.mgr.Close(ctx)
	require.ErrorIs(t, err, memapi.ErrInUse)
	require.Contains(t, err.Error(), "holder h")
	_, err = idle.Allocate(ctx, 4096)
	require.ErrorIs(t, err, memapi.ErrClosed, "an idle binding was closed")
	_, err = e.mgr.Bind("late", "r", dev0)
	require.ErrorIs(t, err, memapi.ErrClosed)
	require.Equal(t, memapi.Bytes(4096), e.m.UsedBytes(), "Close freed a live handle")
	require.NoError(t, buf.Close())
	require.NoError(t, e.mgr.Close(ctx))
	e.settled(t)
}

var _ = errors.New
var _ = pmm.Options{}

// Found by the model: a copy-on-write view unmapped by a release whose
// backing release then failed was unmapped again by the retry, which
// failed forever. A retry now releases only what is left.
func TestRetryAfterAFailedBackingReleaseDoesNotUnmapTwice(t *testing.T) {
	e := setup(t, fakes.Config{})
	b := e.bind(t, "p", "kv")
	ctx := context.Background()
	sh, err := b.CreateShared(ctx, gran)
	require.NoError(t, err)
	r, err := b.ReserveVirtual(ctx, 4*gran)
	require.NoError(t, err)
	_, err = r.MapShared(ctx, sh, memapi.AccessReadOnly)
	require.NoError(t, err)
	require.NoError(t, r.CopyOnWrite(ctx, 0))
	require.NoError(t, sh.Close())
	e.drain(t) // the shared backing is gone; the copy is the region's
	e.m.Inject(fakes.Fault{Method: "ReleaseBacking", Nth: e.m.ReleaseBackingCallCount() + 1, Err: memapi.ErrUnavailable})
	require.NoError(t, r.Close())
	e.drain(t)
	require.Equal(t, ep.Quarantined, r.State())
	require.Equal(t, figures{Charged: gran, Quarantined: gran}, e.l.snapshot())
	e.m.ClearFaults()
	require.NoError(t, r.Retry(ctx))
	e.settled(t)
}
