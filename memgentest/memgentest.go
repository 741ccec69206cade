// Package memgentest sets up memgen for the tests of code that allocates
// through it: one call gives a ProcessMemoryManager over a governor and a
// mechanism (a fake, or the CPU mechanism's real memory), one more a
// Binding, and the test's cleanup fails the test, naming each handle, when
// the code under test leaked a handle or left one quarantined.
//
//	h := memgentest.New(t, memgentest.Options{})
//	b := h.Bind("kv", "cache")   // a *pmm.Binding; the holder is registered for you
//	buf, err := b.Allocate(ctx, 4096)
//
// The authority is named once (Options.Authority): the governor's
// authority, the mechanism's and the device's are that one. A reservation
// with no deadline waits at most Options.Wait (the governor's DefaultWait,
// 5 s here) and then fails, so a test over budget fails instead of hanging.
// Cleanup waits for pending releases at most Options.Drain in all, never
// more: a handle left open is reported, then released so that its memory
// goes back, and a release that cannot complete is reported, not waited
// for. The teardown runs off the test's goroutine: a release stuck in a
// mechanism call that never returns (a Free that hangs) is reported with
// every goroutine's stack once twice the bound plus 2 s passed, and the
// cleanup returns.
package memgentest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

// Options configure New. The zero value is a fake mechanism on authority
// "test" with 64 MiB.
type Options struct {
	// Authority names the one authority of the harness: the governor's,
	// the mechanism's and the device's. "" means "test".
	Authority memapi.AuthorityID
	// Capacity is the authority's capacity; 0 means 64 MiB.
	Capacity memapi.Bytes
	// CPU puts the CPU mechanism (anonymous mmap and memfd memory, Linux)
	// under the manager instead of a fake.
	CPU bool
	// Granularity is the mechanism's granularity of reservations and
	// shared backings: the fake's Config.Granularity (0: 64 KiB) or the
	// CPU mechanism's Options.Granularity (0: 2 MiB).
	Granularity memapi.Bytes
	// Fake configures the fake mechanism (ignored with CPU): Offers,
	// Capacity (the device running out of memory), AllocGranularity...
	// Its Authority is Options.Authority.
	Fake fakes.Config
	// NoSites turns off what a leak report says of where each handle was
	// made (the line outside memgen that allocated it: pmm's
	// Options.RecordSites, on by default here).
	NoSites bool
	// Wait bounds a reservation with no deadline (governor
	// Options.DefaultWait); 0 means 5 s, negative waits without bound.
	Wait time.Duration
	// Drain bounds the whole cleanup: waiting for pending releases, for
	// the released leaks and for the device context to close. 0 means
	// 10 s.
	Drain time.Duration
	// Governor configures the governor (its Clock, OnEvent, Logger); its
	// DefaultWait is Wait.
	Governor governor.Options
}

// Harness is what New set up. Its fields are for the test to inspect
// (snapshots, fault injection on the fake); Bind is how it gets memory.
type Harness struct {
	// Governor is the ledger, with one authority: Authority.
	Governor *governor.Governor
	// Manager is the ProcessMemoryManager with one device: Device.
	Manager *pmm.Manager
	// Device is the key of the manager's one device.
	Device memapi.DeviceKey
	// Authority is the authority of the device and of the governor.
	Authority memapi.AuthorityID
	// Context is the device context with its deferred-free queue.
	Context *ep.Context
	// Mechanism is the bare mechanism under the manager (a
	// *fakes.Mechanism or a *cpu.Mechanism).
	Mechanism memapi.Mechanism
	// Fake is the fake mechanism, nil with Options.CPU: inject faults,
	// count calls.
	Fake *fakes.Mechanism
	// FakeContext is the fake's device context, nil with Options.CPU:
	// SetManualFences, CompleteAll.
	FakeContext *fakes.Context

	t     testing.TB
	drain time.Duration
}

// New sets up a governor with one authority, a mechanism accounting to it,
// its device context and a manager with that one device, and registers the
// cleanup that reports leaks. A failure to set up fails the test at once.
func New(t testing.TB, opts Options) *Harness {
	t.Helper()
	if opts.Authority == "" {
		opts.Authority = "test"
	}
	if opts.Capacity == 0 {
		opts.Capacity = 64 << 20
	}
	if opts.Wait == 0 {
		opts.Wait = 5 * time.Second
	}
	if opts.Drain <= 0 {
		opts.Drain = 10 * time.Second
	}
	h := &Harness{Authority: opts.Authority, t: t, drain: opts.Drain}
	var dev memapi.DeviceContext
	if opts.CPU {
		m, err := cpu.New(cpu.Options{Authority: opts.Authority, Granularity: opts.Granularity})
		if err != nil {
			t.Fatalf("memgentest: the CPU mechanism: %v", err)
		}
		h.Mechanism, dev = m, cpu.NewContext(m)
	} else {
		cfg := opts.Fake
		cfg.Authority = opts.Authority
		if opts.Granularity != 0 {
			cfg.Granularity = opts.Granularity
		}
		h.Fake = fakes.NewMechanism(cfg)
		h.FakeContext = fakes.NewContext(h.Fake)
		h.Mechanism, dev = h.Fake, h.FakeContext
	}
	h.Device = h.Mechanism.Info().Device

	gopts := opts.Governor
	gopts.DefaultWait = opts.Wait
	h.Governor = governor.New(gopts)
	h.Context = ep.NewContext(dev, ep.Options{})
	t.Cleanup(h.cleanup) // registered before anything can fail below, so it all unwinds
	if err := h.Governor.AddAuthority(opts.Authority, opts.Capacity); err != nil {
		t.Fatalf("memgentest: %v", err)
	}
	h.Manager = pmm.New(h.Governor, pmm.Options{Verify: true, RecordSites: !opts.NoSites})
	if err := h.Manager.Register(pmm.Device{Key: h.Device, Mechanism: h.Mechanism, Context: h.Context, Authority: opts.Authority}); err != nil {
		t.Fatalf("memgentest: %v", err)
	}
	return h
}

// Bind binds holder in role to the device, registering holder with the
// governor first unless it already is (with a Holder that frees nothing
// when asked: use Register for one that does). A failure fails the test.
func (h *Harness) Bind(holder, role string, opts ...pmm.BindOption) *pmm.Binding {
	h.t.Helper()
	err := h.Governor.Register(governor.HolderID(holder), governor.HolderFunc(func(context.Context, governor.Ticket) (memapi.Bytes, error) {
		return 0, nil
	}), governor.HolderOptions{})
	if err != nil && !errors.Is(err, memapi.ErrInUse) {
		h.t.Fatalf("memgentest: %v", err)
	}
	b, err := h.Manager.Bind(holder, role, h.Device, opts...)
	if err != nil {
		h.t.Fatalf("memgentest: %v", err)
	}
	return b
}

// Register registers a holder that reclaims (a cache, a KV store) before
// Bind binds it.
func (h *Harness) Register(holder string, r governor.Holder, opts governor.HolderOptions) {
	h.t.Helper()
	if err := h.Governor.Register(governor.HolderID(holder), r, opts); err != nil {
		h.t.Fatalf("memgentest: %v", err)
	}
}

// Snapshot returns the authority's figures now.
func (h *Harness) Snapshot() governor.AuthoritySnapshot {
	s, _ := h.Governor.Authority(h.Authority)
	return s
}

// cleanup reports what the test left behind and takes it all down, within
// the drain bound whatever happens.
func (h *Harness) cleanup() {
	t := h.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), h.drain)
	defer cancel()
	// The teardown runs off the test's goroutine: a release runs inline in
	// the goroutine that closes its handle, so a mechanism call that never
	// returns (a Free that hangs) would hold the test's cleanup forever.
	// Waiting for it is bounded by twice the drain bound plus 2 s, a grace
	// for the calls that honour their context to return on a loaded
	// machine; a teardown still running then is reported and left behind.
	var (
		reported []string
		err      error
	)
	names := h.handleNames()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer h.Governor.Close()
		reported, err = h.teardown(ctx)
	}()
	grace := time.NewTimer(2*h.drain + 2*time.Second)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		t.Errorf("memgentest: the teardown did not return within the drain bound of %v: a release is stuck in a call that does not return (the handles at the end of the test: %v); every goroutine, the stuck release among them:\n%s",
			h.drain, names, stacks())
		return
	}
	for _, msg := range reported {
		t.Errorf("%s", msg)
	}
	if err != nil && len(reported) == 0 {
		t.Errorf("memgentest: teardown within %v: %v", h.drain, err)
	}
	if len(reported) > 0 || err != nil {
		return
	}
	if s := h.Snapshot(); s.Reserved != 0 || s.Charged != 0 || s.Pending != 0 {
		t.Errorf("memgentest: authority %s not back to zero after every handle was released: reserved %d, charged %d, pending %d",
			h.Authority, s.Reserved, s.Charged, s.Pending)
	}
	if h.Fake != nil {
		if n := h.Fake.UsedBytes(); n != 0 {
			t.Errorf("memgentest: the fake mechanism still holds %d bytes after every handle was released", n)
		}
	}
}

// teardown runs the releases the test scheduled, reports what is left
// (report), and gives it all back: the leaks closed, the quarantined
// retried, the manager and the context closed, bounded by ctx.
func (h *Harness) teardown(ctx context.Context) (reported []string, err error) {
	if h.Manager == nil {
		return nil, h.Context.Close(ctx, true)
	}
	// Releases the test scheduled run first: only what is still there
	// after them was left behind.
	_ = h.Context.Queue().Drain(ctx)
	reported = h.report(ctx)
	// Give the leaks back, so that their memory and the device context
	// are released, within what is left of the bound.
	for _, l := range h.Context.Handles() {
		if l.State() == ep.Open {
			_ = l.Close()
		}
	}
	_ = h.Context.RetryQuarantined()
	err = h.Manager.Close(ctx)
	if err == nil {
		err = h.Context.Close(ctx, true)
	}
	return reported, err
}

// handleNames names the handles that hold the device context, with their
// states.
func (h *Harness) handleNames() []string {
	var out []string
	for _, l := range h.Context.Handles() {
		out = append(out, fmt.Sprintf("%s (%v)", l.Name(), l.State()))
	}
	return out
}

// stacks returns every goroutine's stack.
func stacks() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// report describes each handle still holding the device context, naming
// it: one failure of the test each (the caller reports them from the
// test's goroutine).
func (h *Harness) report(ctx context.Context) []string {
	var out []string
	for _, l := range h.Context.Handles() {
		switch st := l.State(); st {
		case ep.Open, ep.Closing:
			out = append(out, fmt.Sprintf("memgentest: leaked %s: still %v at the end of the test (never closed)%s", l.Name(), st, origin(l)))
		case ep.Quarantined:
			out = append(out, fmt.Sprintf("memgentest: quarantined %s: its release failed and its memory is still held: %v%s", l.Name(), l.Err(), origin(l)))
		default:
			out = append(out, fmt.Sprintf("memgentest: %s is still %v after waiting for its release (%v): a recorded fence never completed%s",
				l.Name(), st, context.Cause(ctx), origin(l)))
		}
	}
	return out
}

// origin is what a report adds of where the handle came from: "; 65536
// bytes, made at cache_test.go:42 (...)", or nothing.
func origin(l *ep.Lifecycle) string {
	if o := l.Origin(); o != "" {
		return "; " + o
	}
	return ""
}
