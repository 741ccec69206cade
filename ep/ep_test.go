package ep_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fence is a test fence the test completes by hand.
type fence struct {
	ch       chan struct{}
	pollOnly bool
	done     atomic.Bool
	once     sync.Once
}

func newFence(pollOnly bool) *fence { return &fence{ch: make(chan struct{}), pollOnly: pollOnly} }

func (f *fence) Complete()  { f.once.Do(func() { f.done.Store(true); close(f.ch) }) }
func (f *fence) Done() bool { return f.done.Load() }
func (f *fence) Ready() <-chan struct{} {
	if f.pollOnly {
		return nil
	}
	return f.ch
}
func (f *fence) Wait(ctx context.Context) error {
	select {
	case <-f.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// log records events in order, as the fakes' recorder would.
type log struct {
	mu sync.Mutex
	ev []string
}

func (l *log) add(s string) { l.mu.Lock(); l.ev = append(l.ev, s); l.mu.Unlock() }
func (l *log) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ev...)
}

type devCtx struct{ closed atomic.Int32 }

func (d *devCtx) Device() memapi.DeviceKey          { return memapi.DeviceKey{Kind: memapi.DeviceKindHost} }
func (d *devCtx) NewStream() (memapi.Stream, error) { return nil, memapi.ErrUnsupported }
func (d *devCtx) Close() error                      { d.closed.Add(1); return nil }

func newCtx(t *testing.T) (*ep.Context, *devCtx) {
	d := &devCtx{}
	c := ep.NewContext(d, ep.Options{})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, c.Close(ctx, true))
	})
	return c, d
}

func drain(t *testing.T, c *ep.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, c.Queue().Drain(ctx))
}

func TestReleaseWaitsForEveryFenceThenFreesThenRefunds(t *testing.T) {
	for _, poll := range []bool{false, true} {
		t.Run(map[bool]string{false: "ready-channel", true: "poll-only"}[poll], func(t *testing.T) {
			c, _ := newCtx(t)
			var l log
			o, err := c.Own("buf", &releaser{pending: func() { l.add("pending") }, free: func(context.Context) error {
				l.add("free")
				l.add("refund")
				return nil
			}})
			require.NoError(t, err)
			f1, f2 := newFence(poll), newFence(poll)
			require.NoError(t, o.RecordUse(f1))
			require.NoError(t, o.RecordUse(f2))
			require.NoError(t, o.Close()) // returns at once: the fences are pending
			require.Equal(t, []string{"pending"}, l.get())
			require.Equal(t, 1, c.Live())

			f2.Complete()
			time.Sleep(5 * time.Millisecond) // give a wrong queue the chance to free early
			require.Equal(t, []string{"pending"}, l.get(), "freed before every fence completed")

			f1.Complete()
			drain(t, c)
			require.Equal(t, []string{"pending", "free", "refund"}, l.get())
			require.Equal(t, 0, c.Live())
			require.Equal(t, uint64(1), c.Queue().Stats().Freed)
		})
	}
}

func TestCloseIsIdempotentAndRecordUseAfterCloseFails(t *testing.T) {
	c, _ := newCtx(t)
	var frees atomic.Int32
	o, err := c.Own("buf", &releaser{free: func(context.Context) error { frees.Add(1); return nil }})
	require.NoError(t, err)
	require.NoError(t, o.Close())
	require.NoError(t, o.Close())
	require.True(t, o.Closed())
	err = o.RecordUse(newFence(false))
	require.ErrorIs(t, err, memapi.ErrReleased)
	drain(t, c)
	require.Equal(t, int32(1), frees.Load())
}

func TestContextPinning(t *testing.T) {
	d := &devCtx{}
	c := ep.NewContext(d, ep.Options{})
	f := newFence(false)
	var freed atomic.Bool
	o, err := c.Own("kv", &releaser{free: func(context.Context) error { freed.Store(true); return nil }})
	require.NoError(t, err)
	require.NoError(t, o.RecordUse(f))

	err = c.Close(context.Background(), false)
	var me *memapi.Error
	require.ErrorAs(t, err, &me)
	require.ErrorIs(t, err, memapi.ErrInUse)
	require.Contains(t, me.Detail, "1 allocation")
	require.False(t, freed.Load(), "Close freed underneath a live allocation")
	require.Equal(t, int32(0), d.closed.Load())

	// Waiting with a deadline that passes: still in use, nothing freed.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.Close(ctx, true), memapi.ErrInUse)
	require.False(t, freed.Load())

	// Close the handle (fence pending) and wait: Close returns once freed.
	require.NoError(t, o.Close())
	done := make(chan error, 1)
	go func() { done <- c.Close(context.Background(), true) }()
	select {
	case err := <-done:
		t.Fatalf("Close returned %v before the fence completed", err)
	case <-time.After(5 * time.Millisecond):
	}
	f.Complete()
	require.NoError(t, watchdog.Recv(t, watchdog.Bound, "Close waiting for the free", done))
	require.True(t, freed.Load())
	require.Equal(t, int32(1), d.closed.Load())

	_, err = c.Own("late", &releaser{free: func(context.Context) error { return nil }})
	require.ErrorIs(t, err, memapi.ErrClosed)
	require.NoError(t, c.Close(context.Background(), false), "Close after Close")
}

func TestFailedFreeKeepsTheContextPinned(t *testing.T) {
	var reported atomic.Int32
	d := &devCtx{}
	var buf bytes.Buffer
	c := ep.NewContext(d, ep.Options{
		Logger:  slog.New(slog.NewTextHandler(&syncWriter{w: &buf}, nil)),
		OnError: func(string, error) { reported.Add(1) },
	})
	boom := errors.New("device busy")
	fail := atomic.Bool{}
	fail.Store(true)
	o, err := c.Own("w", &releaser{free: func(context.Context) error {
		if fail.Load() {
			return boom
		}
		return nil
	}})
	require.NoError(t, err)
	require.NoError(t, o.Close())
	drain(t, c)
	require.Equal(t, int32(1), reported.Load())
	require.Equal(t, uint64(1), c.Queue().Stats().Failed)
	require.Equal(t, 1, c.Live(), "a failed free must leave the allocation counted")
	require.ErrorIs(t, c.Close(context.Background(), false), memapi.ErrInUse)
	// Settle it so the context can close: pins are released only by a free.
	c.Unpin()
	require.NoError(t, c.Close(context.Background(), false))
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
func (s *syncWriter) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.w.String() }

func TestDroppedHandleIsReportedAndStillReleased(t *testing.T) {
	sw := &syncWriter{w: &bytes.Buffer{}}
	c := ep.NewContext(&devCtx{}, ep.Options{Logger: slog.New(slog.NewTextHandler(sw, nil))})
	before := ep.Leaks()
	var freed atomic.Bool
	pending := newFence(false)
	func() {
		o, err := c.Own("forgotten", &releaser{free: func(context.Context) error { freed.Store(true); return nil }})
		require.NoError(t, err)
		require.NoError(t, o.RecordUse(pending))
	}()
	// The fence above is not complete, so that release must wait for it.
	// A second dropped handle, whose fence is complete, shows the release.
	var freed2 atomic.Bool
	func() {
		o, err := c.Own("forgotten2", &releaser{free: func(context.Context) error { freed2.Store(true); return nil }})
		require.NoError(t, err)
		f := newFence(false)
		f.Complete()
		require.NoError(t, o.RecordUse(f))
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !freed2.Load() && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	require.True(t, freed2.Load(), "a dropped handle was not released")
	require.False(t, freed.Load(), "a dropped handle was freed before its fence completed")
	require.GreaterOrEqual(t, ep.Leaks()-before, uint64(1))
	require.Contains(t, sw.String(), "dropped without Close")
	require.GreaterOrEqual(t, c.Queue().Stats().Leaked, uint64(1))

	// The first dropped handle is released only once its fence completes.
	for c.Queue().Stats().Leaked < 2 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, uint64(2), c.Queue().Stats().Leaked)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.Close(ctx, true), memapi.ErrInUse, "closed with a pending release")
	require.False(t, freed.Load())
	pending.Complete()
	watchdog.Within(t, watchdog.Bound, "Close waiting for the release", func() {
		require.NoError(t, c.Close(context.Background(), true))
	})
	require.True(t, freed.Load())
}

func TestQueueCloseKeepsPendingReleases(t *testing.T) {
	q := ep.NewQueue(ep.Options{})
	f := newFence(true)
	var freed atomic.Bool
	require.NoError(t, q.Enqueue(ep.Release{Name: "x", Fences: []memapi.Fence{f}, Free: func(context.Context) error { freed.Store(true); return nil }}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	err := q.Close(ctx)
	require.ErrorIs(t, err, memapi.ErrInUse)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, freed.Load())
	require.Equal(t, 1, q.Stats().Pending)
	// Still running: a new release is accepted and the old one completes.
	require.NoError(t, q.Enqueue(ep.Release{Name: "y", Free: func(context.Context) error { return nil }}))
	f.Complete()
	require.NoError(t, q.Close(context.Background()))
	require.True(t, freed.Load())
	require.Equal(t, uint64(2), q.Stats().Freed)
	require.ErrorIs(t, q.Enqueue(ep.Release{Name: "z", Free: func(context.Context) error { return nil }}), memapi.ErrClosed)
}

// A Drain that starts while a release waits for its fence returns when the
// release has run, and a Close that waits for a live handle returns when
// the handle is released: each waiter is woken by the count it waits on
// reaching zero, not by a poll.
func TestWaitersWokenAtZero(t *testing.T) {
	c, _ := newCtx(t)
	f := newFence(false)
	o, err := c.Own("kv", &releaser{free: func(context.Context) error { return nil }})
	require.NoError(t, err)
	require.NoError(t, o.RecordUse(f))
	require.NoError(t, o.Close()) // pending behind f

	drained := make(chan error, 1)
	go func() { drained <- c.Queue().Drain(context.Background()) }()
	select {
	case err := <-drained:
		t.Fatalf("Drain returned %v while a release waits for its fence", err)
	case <-time.After(5 * time.Millisecond):
	}
	f.Complete()
	require.NoError(t, watchdog.Recv(t, watchdog.Bound, "Drain waiting for the release", drained))

	d := &devCtx{}
	c2 := ep.NewContext(d, ep.Options{})
	o2, err := c2.Own("kv", &releaser{free: func(context.Context) error { return nil }})
	require.NoError(t, err)
	closed := make(chan error, 1)
	go func() { closed <- c2.Close(context.Background(), true) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned %v while a handle is live", err)
	case <-time.After(5 * time.Millisecond):
	}
	require.NoError(t, o2.Close())
	require.NoError(t, watchdog.Recv(t, watchdog.Bound, "Close waiting for the handle", closed))
	require.Equal(t, int32(1), d.closed.Load())
}

// handle is a layer's handle with its Owned embedded by value (OwnIn), as
// pmm's are.
type handle struct {
	ep.Owned
	addr uint64
}

func TestOwnInWatchesTheEmbeddingHandle(t *testing.T) {
	c := ep.NewContext(&devCtx{}, ep.Options{})
	var freed atomic.Bool
	func() {
		h := &handle{addr: 0xabc0}
		require.NoError(t, c.OwnIn(&h.Owned, "embedded", &releaser{free: func(context.Context) error { freed.Store(true); return nil }}, ep.Origin{Bytes: 64, Addr: h.addr}))
		require.Equal(t, "embedded 0xabc0", h.Lifecycle().Name(), "the name is the label and the address")
		// A second OwnIn into the same Owned is refused and changes nothing.
		err := c.OwnIn(&h.Owned, "again", &releaser{free: func(context.Context) error { return nil }}, ep.Origin{})
		require.ErrorIs(t, err, memapi.ErrInvalidSize)
		require.Contains(t, err.Error(), "already owning embedded 0xabc0")
		require.Equal(t, ep.Open, h.State())
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !freed.Load() && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	require.True(t, freed.Load(), "a dropped handle embedding its Owned was not released")
	require.NoError(t, c.Close(context.Background(), true))
}

func TestDrainWithNothingPendingIgnoresACancelledContext(t *testing.T) {
	q := ep.NewQueue(ep.Options{})
	defer q.Close(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 100 { // a select between two ready cases would pick either
		require.NoError(t, q.Drain(ctx))
	}
}
