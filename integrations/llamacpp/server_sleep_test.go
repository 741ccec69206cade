package llamacpp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/pmm"
)

// An idle server puts its model to sleep (the weights and KV cache move to
// the host tier), and the next request wakes it and gets the tokens an
// awake server gives.
func TestServerSleepsWhenIdle(t *testing.T) {
	r := newRig(t, 1<<30)
	tier := r.hostTier(t)
	m := loadModelAt(t, gqaModelPath, r.options())
	if _, err := NewServer(bg(t), m, ServerOptions{SleepAfter: time.Millisecond}); !errors.Is(err, memapi.ErrNilHandle) {
		t.Fatalf("SleepAfter without SleepTo: %v", err)
	}
	s, err := NewServer(bg(t), m, ServerOptions{Sequences: 2, NCtx: 512, SleepAfter: 50 * time.Millisecond, SleepTo: tier.bind})
	if err != nil {
		t.Fatal(err)
	}
	complete := completer(t, serve(t, s))
	awaitAsleep := func() {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !s.Stats().Asleep; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the idle server did not sleep within 30 s: %+v", s.Stats())
			}
		}
	}
	weights := r.charged(m.Holder())
	awaitAsleep() // idle from the start
	first := complete()
	awaitAsleep()
	r.settle(t)
	if w := r.charged(m.Holder()); w != 0 || r.chargedOn("sleep", offloadAuth) < weights {
		t.Fatalf("asleep: the weights hold %d on the device (were %d), the host tier %d", w, weights, r.chargedOn("sleep", offloadAuth))
	}
	if dev, _ := r.g.Authority(hostAuth); dev.Charged != r.mech.UsedBytes() {
		t.Fatalf("the device's ledger %d, its mechanism %d", dev.Charged, r.mech.UsedBytes())
	}
	second := complete()
	sameTokens(t, "server, level 1: a request after a wake against one before the sleep", second, first)
	st := s.Stats()
	if st.Sleeps < 2 || st.Wakes < 2 || st.SleepErrors != 0 {
		t.Fatalf("stats %+v: want at least two sleeps and wakes, no error", st)
	}
	t.Logf("%d sleeps, %d wakes in %v; the weights (%d bytes) waited in the host tier", st.Sleeps, st.Wakes, st.WakeTime, weights)
}

// At level 2 an idle server discards its weights (nothing goes to a host
// tier: it has none) and the next request reloads them from the model
// file and gets the tokens an awake server gives.
func TestServerSleepsLevel2(t *testing.T) {
	r := newRig(t, 1<<30)
	m := loadModelAt(t, gqaModelPath, r.options())
	if _, err := NewServer(bg(t), m, ServerOptions{SleepAfter: time.Millisecond, SleepLevel: 3}); !errors.Is(err, ErrSleepLevel) {
		t.Fatalf("SleepLevel 3: %v", err)
	}
	s, err := NewServer(bg(t), m, ServerOptions{Sequences: 2, NCtx: 512, SleepAfter: 50 * time.Millisecond, SleepLevel: 2})
	if err != nil {
		t.Fatal(err)
	}
	complete := completer(t, serve(t, s))
	awaitAsleep := func() {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !s.Stats().Asleep; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the idle server did not sleep within 30 s: %+v", s.Stats())
			}
		}
	}
	weights := r.charged(m.Holder())
	first := complete()
	awaitAsleep()
	r.settle(t)
	if w, st := r.charged(m.Holder()), m.SleepState(); w != 0 || st.Level != 2 || st.Discarded != weights {
		t.Fatalf("asleep: the weights hold %d on the device (were %d), state %+v", w, weights, st)
	}
	second := complete()
	sameTokens(t, "server, level 2: a request after a wake against one before the sleep", second, first)
	if st := s.Stats(); st.Sleeps < 1 || st.Wakes < 1 || st.SleepErrors != 0 {
		t.Fatalf("stats %+v: want a sleep and a wake, no error", st)
	}
}

// A server made with SleepOnPressure puts its idle model to sleep when
// another holder's reservation is short (the governor asks the weights'
// holder for memory, as it would for another process's want on a shared
// ledger): the reservation is served from what the sleep gave back, the
// ledger stays exact on both tiers, and the next request wakes the model
// and gets the tokens of a request before the sleep. While a request runs,
// the weights' holder gives nothing and says so (PressureBusy): the model
// stays awake and the short reservation fails.
func TestServerSleepsOnPressure(t *testing.T) {
	for _, level := range []int{1, 2} {
		t.Run(fmt.Sprintf("level%d", level), func(t *testing.T) { sleepsOnPressure(t, level) })
	}
}

func sleepsOnPressure(t *testing.T, level int) {
	const capacity = 256 << 20
	r := newRig(t, capacity)
	tier := r.hostTier(t)
	opts := r.options()
	plain := loadModelAt(t, gqaModelPath, opts)
	if _, err := NewServer(bg(t), plain, ServerOptions{SleepOnPressure: true, SleepTo: tier.bind}); !errors.Is(err, memapi.ErrUnsupported) {
		t.Fatalf("SleepOnPressure with a model loaded without it: %v", err)
	}
	if err := plain.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	opts.Name, opts.SleepOnPressure = "pressed", true
	m := loadModelAt(t, gqaModelPath, opts)
	if _, err := NewServer(bg(t), m, ServerOptions{SleepOnPressure: true}); !errors.Is(err, memapi.ErrNilHandle) {
		t.Fatalf("SleepOnPressure at level 1 without SleepTo: %v", err)
	}
	// idled hears the server's loop begin each wait for a request (set
	// before the loop starts).
	idled := make(chan struct{}, 1)
	idleCall = func() {
		select {
		case idled <- struct{}{}:
		default:
		}
	}
	t.Cleanup(func() { idleCall = nil })
	s, err := NewServer(bg(t), m, ServerOptions{Sequences: 2, NCtx: 512, SleepOnPressure: true, SleepLevel: level, SleepTo: tier.bind})
	if err != nil {
		t.Fatal(err)
	}
	complete := completer(t, serve(t, s))
	other := r.other(t)
	// want is more than the device has free, less than it has once the
	// weights are given back.
	want := func() memapi.Bytes {
		t.Helper()
		r.settle(t)
		dev, _ := r.g.Authority(hostAuth)
		return (capacity-dev.Charged+m.WeightBytes()/2)&^(4<<10-1) + 4<<10
	}
	allocate := func(n memapi.Bytes, wait time.Duration) (*pmm.Buffer, error) {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		return other.Allocate(ctx, n)
	}

	first := complete() // an uninterrupted run
	exactTiers(t, r, tier)
	weights := r.charged(m.Holder())

	// A request running: the weights give nothing.
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	stepCall = func([]SeqTokens) {
		once.Do(func() {
			close(entered)
			<-release
		})
	}
	t.Cleanup(func() { stepCall = nil })
	busy := make(chan []int32, 1)
	go func() { busy <- complete() }()
	<-entered
	select {
	case <-idled: // the loop's wait before the request
	default:
	}
	if b, err := allocate(want(), 300*time.Millisecond); !errors.Is(err, memapi.ErrOverBudget) {
		if b != nil {
			b.Close()
		}
		t.Fatalf("a reservation beyond the free bytes while a request runs: %v, want it refused", err)
	}
	st := s.Stats()
	if st.PressureBusy == 0 || st.PressureSleeps != 0 || m.Asleep() || r.charged(m.Holder()) != weights {
		t.Fatalf("while a request ran: stats %+v, asleep %v, weights %d of %d charged", st, m.Asleep(), r.charged(m.Holder()), weights)
	}
	t.Logf("while a request ran: %d ticket(s) to the weights answered with nothing", st.PressureBusy)
	close(release)
	sameTokens(t, fmt.Sprintf("server, level %d: the request that ran through the pressure", level), <-busy, first)
	exactTiers(t, r, tier)

	// Idle: the ticket puts the model to sleep and the reservation is
	// served from what it gave back. (The loop may still be finishing
	// the request when its reply arrives: the reservation waits until
	// the loop waits idle, where the ticket is its to answer.)
	watchdog.Recv(t, watchdog.Bound, "the server's loop waiting idle", idled)
	r.settle(t)
	before, _ := r.g.Authority(hostAuth)
	n := want()
	b, err := allocate(n, 20*time.Second)
	if err != nil {
		t.Fatalf("a reservation of %d bytes with the idle model's weights to give: %v (stats %+v)", n, err, s.Stats())
	}
	exactTiers(t, r, tier)
	st = s.Stats()
	if !m.Asleep() || m.SleepState().Level != level || !st.Asleep || st.PressureSleeps != 1 || r.charged(m.Holder()) != 0 {
		t.Fatalf("after the ticket: asleep %v (%+v), stats %+v, weights %d charged", m.Asleep(), m.SleepState(), st, r.charged(m.Holder()))
	}
	if st.PressureFreed < weights {
		t.Fatalf("the sleep reported %d bytes freed, less than the weights' %d", st.PressureFreed, weights)
	}
	if level == 1 && r.chargedOn("sleep", offloadAuth) != st.PressureFreed || level == 2 && r.chargedOn("sleep", offloadAuth) != 0 {
		t.Fatalf("level %d: the host tier holds %d; the sleep freed %d", level, r.chargedOn("sleep", offloadAuth), st.PressureFreed)
	}
	after, _ := r.g.Authority(hostAuth)
	t.Logf("level %d: the ticket's sleep gave back %d bytes (weights %d); device charged %d before, %d after with the other holder's %d",
		level, st.PressureFreed, weights, before.Charged, after.Charged, n)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	exactTiers(t, r, tier)

	// The next request wakes the model.
	second := complete()
	sameTokens(t, fmt.Sprintf("server, level %d: a request after a sleep for a pressure ticket", level), second, first)
	exactTiers(t, r, tier)
	if st := s.Stats(); st.Asleep || st.Wakes != 1 || m.Asleep() || r.charged(m.Holder()) != weights {
		t.Fatalf("after the next request: stats %+v, weights %d of %d", st, r.charged(m.Holder()), weights)
	}
}

// completer returns a function that asks hs for 12 tokens after the
// same prompt and returns them, failing the test on any other answer.
func completer(t *testing.T, hs *httptest.Server) func() []int32 {
	return func() []int32 {
		t.Helper()
		code, _, body := post(t, hs.URL+"/v1/completions", `{"prompt": "The ledger is", "max_tokens": 12}`)
		var c completion
		if code != http.StatusOK || json.Unmarshal(body, &c) != nil || len(c.Choices) != 1 {
			t.Fatalf("completion: %d %s", code, body)
		}
		return c.Choices[0].Tokens
	}
}

// TestServerAnswersATicketBeforeItWaitsIdle: a pressure ticket that comes
// after the last request ended for its client, while the server's loop has
// not yet begun to wait idle, is the idle loop's to answer: the model goes
// to sleep and the reservation is served, as for a ticket that comes while
// the loop waits. (The loop is held at the start of its wait until the
// ticket has come.)
func TestServerAnswersATicketBeforeItWaitsIdle(t *testing.T) {
	const capacity = 256 << 20
	r := newRig(t, capacity)
	tier := r.hostTier(t)
	opts := r.options()
	opts.Name, opts.SleepOnPressure = "pressed", true
	m := loadModelAt(t, gqaModelPath, opts)
	// hold, when set, holds the loop at the start of its wait until it is
	// closed; step, when set, is called at each step (both set before the
	// loop starts, read by it).
	var hold atomic.Pointer[chan struct{}]
	var step atomic.Pointer[func()]
	// idles counts the loop's waits begun and past the hold: a gate
	// armed before the loop has begun the wait that follows the last
	// request would hold that wait, not the one after the next request,
	// and the next request would never be taken (idleAt).
	var idles atomic.Int64
	idleCall = func() {
		if h := hold.Load(); h != nil {
			<-*h
		}
		idles.Add(1)
	}
	idleAt := func(n int64) {
		t.Helper()
		watchdog.Within(t, watchdog.Bound, fmt.Sprintf("the loop's wait number %d", n), func() {
			for idles.Load() < n {
				time.Sleep(time.Millisecond)
			}
		})
	}
	stepCall = func([]SeqTokens) {
		if f := step.Load(); f != nil {
			(*f)()
		}
	}
	t.Cleanup(func() { idleCall, stepCall = nil, nil })
	arm := func() chan struct{} { h := make(chan struct{}); hold.Store(&h); return h }
	open := func(h chan struct{}) { hold.Store(nil); close(h) }
	s, err := NewServer(bg(t), m, ServerOptions{Sequences: 2, NCtx: 512, SleepOnPressure: true, SleepLevel: 1, SleepTo: tier.bind})
	if err != nil {
		t.Fatal(err)
	}
	complete := completer(t, serve(t, s))
	t.Cleanup(func() { // a failed test lets a held loop go, for the server to close
		if h := hold.Load(); h != nil {
			open(*h)
		}
	})
	other := r.other(t)
	first := complete()
	weights := r.charged(m.Holder())

	idleAt(2)     // the waits at the start and after the first request
	gate := arm() // the loop's next wait, after the request below, holds
	second := complete()
	sameTokens(t, "server: the request before the ticket", second, first)
	r.settle(t)
	dev, _ := r.g.Authority(hostAuth)
	n := (capacity-dev.Charged+m.WeightBytes()/2)&^(4<<10-1) + 4<<10
	busy := s.Stats().PressureBusy
	got := make(chan error, 1)
	var b *pmm.Buffer
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		b, err = other.Allocate(ctx, n)
		got <- err
	}()
	watchdog.Within(t, watchdog.Bound, "the ticket reaching the server", func() {
		for len(s.asks) == 0 && s.Stats().PressureBusy == busy {
			time.Sleep(time.Millisecond)
		}
	})
	open(gate)
	if err := watchdog.Recv(t, watchdog.Bound, "the reservation", got); err != nil {
		t.Fatalf("a reservation of %d bytes, its ticket come before the loop waited idle: %v (stats %+v)", n, err, s.Stats())
	}
	st := s.Stats()
	if !m.Asleep() || st.PressureSleeps != 1 || st.PressureBusy != busy || r.charged(m.Holder()) != 0 || st.PressureFreed < weights {
		t.Fatalf("after the ticket: asleep %v, stats %+v, weights %d charged (of %d)", m.Asleep(), st, r.charged(m.Holder()), weights)
	}
	exactTiers(t, r, tier)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	// A ticket waiting for the loop while a request is admitted is answered
	// with nothing before the request's first step, whichever of the two
	// the loop's wait takes first (four rounds).
	for round := range 4 {
		// The wait the ticket above was answered in, then two a round:
		// after its first request and after its second.
		idleAt(3 + 2*int64(round))
		gate := arm() // the loop's wait after this request holds
		sameTokens(t, "server: a request that wakes the model", complete(), first)
		entered, release := make(chan struct{}), make(chan struct{})
		let := sync.OnceFunc(func() { close(release) })
		t.Cleanup(let) // a failed round lets the loop go, for the server to close
		var once sync.Once
		blockFirst := func() { once.Do(func() { close(entered); <-release }) }
		step.Store(&blockFirst)
		// The loop is held at the start of its wait: it takes its turn
		// only once the ticket waits and the request below is admitted.
		r.settle(t)
		dev, _ := r.g.Authority(hostAuth)
		n := (capacity-dev.Charged+m.WeightBytes()/2)&^(4<<10-1) + 4<<10
		busy := s.Stats().PressureBusy
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			b, err := other.Allocate(ctx, n)
			if b != nil {
				b.Close()
			}
			got <- err
		}()
		watchdog.Within(t, watchdog.Bound, "the ticket waiting for the loop", func() {
			for len(s.asks) == 0 {
				time.Sleep(time.Millisecond)
			}
		})
		done := make(chan []int32, 1)
		go func() { done <- complete() }()
		watchdog.Within(t, watchdog.Bound, "the request admitted", func() {
			for len(s.jobs) == 0 {
				time.Sleep(time.Millisecond)
			}
		})
		open(gate)
		watchdog.Recv(t, watchdog.Bound, "the request's first step", entered)
		err := watchdog.Recv(t, watchdog.Bound, "the reservation", got)
		if !errors.Is(err, memapi.ErrOverBudget) || s.Stats().PressureBusy != busy+1 || m.Asleep() {
			t.Fatalf("round %d: a ticket waiting as a request was admitted: %v, stats %+v, asleep %v", round, err, s.Stats(), m.Asleep())
		}
		let()
		sameTokens(t, "server: the request admitted beside the ticket", <-done, first)
		step.Store(nil)
	}
}
