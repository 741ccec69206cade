package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

// The host tier of the sleep tests: a second CPU mechanism on an authority
// of its own, registered with the rig's manager.
const offloadAuth = memapi.AuthorityID("offload")

type hostTier struct {
	mech *cpu.Mechanism
	ectx *ep.Context
	bind *pmm.Binding
}

func (r *rig) hostTier(t testing.TB) *hostTier {
	t.Helper()
	if err := r.g.AddAuthority(offloadAuth, 1<<30); err != nil {
		t.Fatal(err)
	}
	mech, err := cpu.New(cpu.Options{Authority: offloadAuth})
	if err != nil {
		t.Fatal(err)
	}
	ectx := ep.NewContext(cpu.NewContext(mech), ep.Options{})
	key := memapi.DeviceKey{Kind: memapi.DeviceKindHost, Ordinal: 1}
	if err := r.mgr.Register(pmm.Device{Key: key, Mechanism: mech, Context: ectx, Authority: offloadAuth}); err != nil {
		t.Fatal(err)
	}
	if err := r.g.Register("sleep", nil, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := r.mgr.Bind("sleep", "host-copy", key)
	if err != nil {
		t.Fatal(err)
	}
	h := &hostTier{mech: mech, ectx: ectx, bind: b}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := errors.Join(b.Close(), ectx.Close(ctx, true)); err != nil {
			t.Error(err)
		}
	})
	return h
}

// chargedOn is holder h's charge on authority a.
func (r *rig) chargedOn(h governor.HolderID, a memapi.AuthorityID) memapi.Bytes {
	for _, hs := range r.g.Snapshot().Holders {
		if hs.ID != h {
			continue
		}
		for _, x := range hs.Authorities {
			if x.Authority == a {
				return x.Charged
			}
		}
	}
	return 0
}

// A model put to sleep in the middle of a sequence gives its weights' and
// KV cache's bytes back to the device (they wait in the host tier), refuses
// what would touch them, and after Wake decodes on with the greedy tokens
// of an uninterrupted run; the ledger equals the mechanisms' bytes and the
// kernel's at every step. The weights move straight between the two CPU
// mechanisms (direct), and, as they would to a host tier that is not a
// CPU mechanism's, with pmm.Region.Offload (staged).
func TestSleepWakeTokensIdentical(t *testing.T) {
	t.Run("direct", func(t *testing.T) { sleepWakeTokens(t, false) })
	t.Run("staged", func(t *testing.T) {
		stagedMoves = true
		t.Cleanup(func() { stagedMoves = false })
		sleepWakeTokens(t, true)
	})
}

func sleepWakeTokens(t *testing.T, staged bool) {
	r := newRig(t, 1<<30)
	tier := r.hostTier(t)
	m := loadModel(t, r.options())
	c, err := m.NewContext(bg(t), ContextOptions{NCtx: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(bg(t))
	p := prompt(3, 40, m.NVocab())
	run := func(steps int, next int32) ([]int32, int32) {
		var out []int32
		for range steps {
			out = append(out, next)
			var err error
			if next, err = c.Decode(bg(t), []int32{next}); err != nil {
				t.Fatal(err)
			}
		}
		return out, next
	}
	next, err := c.Decode(bg(t), p)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := run(32, next)
	if err := c.Reset(bg(t)); err != nil {
		t.Fatal(err)
	}

	next, err = c.Decode(bg(t), p)
	if err != nil {
		t.Fatal(err)
	}
	got, next := run(16, next)
	r.settle(t)
	weights, kv := r.charged(m.Holder()), c.KV().Committed
	if weights == 0 || kv == 0 {
		t.Fatalf("before the sleep: weights %d, KV %d charged", weights, kv)
	}
	exactTiers(t, r, tier)
	devBefore, _ := r.g.Authority(hostAuth)

	if err := m.Sleep(bg(t), tier.bind); err != nil {
		t.Fatal(err)
	}
	exactTiers(t, r, tier)
	if !m.Asleep() {
		t.Fatal("not asleep")
	}
	dev, _ := r.g.Authority(hostAuth)
	freed := devBefore.Charged - dev.Charged
	freedPercent(t, 1, freed, weights+kv)
	if r.charged(m.Holder()) != 0 || c.KV().Committed != 0 || freed != weights+kv {
		t.Fatalf("asleep: weights %d and KV %d still charged on the device; freed %d of %d", r.charged(m.Holder()), c.KV().Committed, freed, weights+kv)
	}
	if h := r.chargedOn("sleep", offloadAuth); h != weights+kv {
		t.Fatalf("the host tier holds %d, want the weights and KV %d", h, weights+kv)
	}
	for _, o := range m.sleeping {
		if _, direct := o.(*directCopy); direct == staged {
			t.Fatalf("the weights moved as a %T, staged %v", o, staged)
		}
	}
	t.Logf("asleep: the device gave back %d bytes (weights %d, KV %d: 100%%); compute buffers %d stay", freed, weights, kv, dev.Charged)
	if _, err := c.Decode(bg(t), []int32{next}); !errors.Is(err, ErrAsleep) {
		t.Fatalf("a decode while asleep: %v", err)
	}
	if err := c.Reset(bg(t)); !errors.Is(err, ErrAsleep) {
		t.Fatalf("a reset while asleep: %v", err)
	}
	if _, err := m.NewContext(bg(t), ContextOptions{NCtx: 64}); !errors.Is(err, ErrAsleep) {
		t.Fatalf("a new context while asleep: %v", err)
	}
	if err := m.Sleep(bg(t), tier.bind); !errors.Is(err, ErrAsleep) {
		t.Fatalf("a second sleep: %v, want ErrAsleep", err)
	}

	if err := m.Wake(bg(t)); err != nil {
		t.Fatal(err)
	}
	exactTiers(t, r, tier)
	if r.charged(m.Holder()) != weights || c.KV().Committed != kv || r.chargedOn("sleep", offloadAuth) != 0 {
		t.Fatalf("awake: weights %d (want %d), KV %d (want %d), host tier %d", r.charged(m.Holder()), weights, c.KV().Committed, kv, r.chargedOn("sleep", offloadAuth))
	}
	rest, _ := run(16, next)
	got = append(got, rest...)
	path := "direct"
	if staged {
		path = "staged"
	}
	sameTokens(t, "level 1, "+path+" moves", got, want)
	if err := m.Wake(bg(t)); !errors.Is(err, ErrNotAsleep) {
		t.Fatalf("a second wake: %v, want ErrNotAsleep", err)
	}
}

// Closing an asleep context drops its host copies; closing the asleep
// model drops the weights': nothing stays charged on either tier.
func TestSleepThenClose(t *testing.T) {
	r := newRig(t, 1<<30)
	tier := r.hostTier(t)
	m, err := LoadModel(bg(t), modelPath, r.options())
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.NewContext(bg(t), ContextOptions{NCtx: 256})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Decode(bg(t), prompt(1, 20, m.NVocab())); err != nil {
		t.Fatal(err)
	}
	if err := m.Sleep(bg(t), tier.bind); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	r.settle(t)
	for _, a := range []memapi.AuthorityID{hostAuth, offloadAuth} {
		if s, _ := r.g.Authority(a); s.Charged != 0 || s.Reserved != 0 {
			t.Fatalf("%s after closing: %+v", a, s)
		}
	}
	if tier.mech.UsedBytes() != 0 || r.mech.UsedBytes() != 0 {
		t.Fatalf("mechanisms hold %d and %d", r.mech.UsedBytes(), tier.mech.UsedBytes())
	}
}

func TestSleepRefusals(t *testing.T) {
	r := newRig(t, 1<<30)
	tier := r.hostTier(t)
	stock := loadModel(t, Options{Stock: true})
	if err := stock.Sleep(bg(t), tier.bind); !errors.Is(err, memapi.ErrUnsupported) {
		t.Fatalf("a stock model's sleep: %v", err)
	}
	m := loadModel(t, r.options())
	if err := m.Sleep(bg(t), nil); !errors.Is(err, memapi.ErrNilHandle) {
		t.Fatalf("no host binding: %v", err)
	}
	same, err := r.mgr.Bind("sleep", "same-tier", r.host)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Sleep(bg(t), same); !errors.Is(err, memapi.ErrInvalidRange) || m.Asleep() {
		t.Fatalf("a host binding on the device's own authority: %v (asleep %v)", err, m.Asleep())
	}
	// A decode in progress holds the sleep off; a sleep whose ctx ends
	// first is refused with nothing moved.
	c, err := m.NewContext(bg(t), ContextOptions{NCtx: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(bg(t))
	c.mu.Lock()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	err = m.Sleep(ctx, tier.bind)
	cancel()
	c.mu.Unlock()
	if !errors.Is(err, memapi.ErrInUse) || !errors.Is(err, context.DeadlineExceeded) || m.Asleep() {
		t.Fatalf("a sleep while a call runs: %v (asleep %v)", err, m.Asleep())
	}
	if h := r.chargedOn("sleep", offloadAuth); h != 0 {
		t.Fatalf("the refused sleep left %d on the host tier", h)
	}
}

// nthReserve fails the Nth reservation on one authority (counted from 1
// once armed), changing nothing.
type nthReserve struct {
	mu    sync.Mutex
	auth  memapi.AuthorityID
	n, at int // fail the at-th; n counts
}

var errInjected = errors.New("injected reservation fault")

func (f *nthReserve) MaybeError(op memapi.Op) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if op.String() != "governor.Reserve" || op.Authority != f.auth || f.at == 0 {
		return nil
	}
	if f.n++; f.n == f.at {
		return errInjected
	}
	return nil
}

func (f *nthReserve) arm(a memapi.AuthorityID, at int) {
	f.mu.Lock()
	f.auth, f.n, f.at = a, 0, at
	f.mu.Unlock()
}

// A reservation refused at each move of a Sleep (the host tier's, one per
// region) and of a Wake (the device's) leaves the engine whole: a failed
// Sleep restores what it moved and the engine decodes on awake; a failed
// Wake leaves what it did not restore asleep (decodes refused) and the
// next Wake completes. Every step's ledger is exact on both tiers, and the
// tokens are those of an uninterrupted run.
func TestSleepWakeFaultAtEveryStep(t *testing.T) {
	want := func() []int32 {
		r := newRig(t, 1<<30)
		m := loadModel(t, r.options())
		return greedyTokens(t, m, prompt(5, 24, m.NVocab()), 12)
	}()
	for _, phase := range []string{"sleep", "wake"} {
		for at := 1; ; at++ {
			inj := &nthReserve{}
			r := newRigWith(t, 1<<30, cpu.Granularity4KiB, governor.Options{Injector: inj})
			tier := r.hostTier(t)
			m := loadModel(t, r.options())
			c, err := m.NewContext(bg(t), ContextOptions{NCtx: 512})
			if err != nil {
				t.Fatal(err)
			}
			next, err := c.Decode(bg(t), prompt(5, 24, m.NVocab()))
			if err != nil {
				t.Fatal(err)
			}
			got := []int32{next}
			for range 5 {
				if next, err = c.Decode(bg(t), []int32{next}); err != nil {
					t.Fatal(err)
				}
				got = append(got, next)
			}
			exactTiers(t, r, tier)
			if phase == "sleep" {
				inj.arm(offloadAuth, at)
			}
			serr := m.Sleep(bg(t), tier.bind)
			inj.arm("", 0)
			done := false
			switch {
			case phase == "sleep" && serr == nil:
				done = true // every move got past its fault: all steps covered
				if err := m.Wake(bg(t)); err != nil {
					t.Fatal(err)
				}
			case phase == "sleep":
				if !errors.Is(serr, errInjected) || m.Asleep() {
					t.Fatalf("sleep failing at move %d: %v (asleep %v), want the fault and the engine awake", at, serr, m.Asleep())
				}
				faultExact(t, r, tier, 1, fmt.Sprintf("sleep failing at move %d", at))
				if h := r.chargedOn("sleep", offloadAuth); h != 0 {
					t.Fatalf("sleep failing at move %d left %d in the host tier", at, h)
				}
			case serr != nil:
				t.Fatal(serr)
			default:
				inj.arm(hostAuth, at)
				werr := m.Wake(bg(t))
				inj.arm("", 0)
				if werr == nil {
					done = true
					break
				}
				if !errors.Is(werr, errInjected) || !m.Asleep() {
					t.Fatalf("wake failing at restore %d: %v (asleep %v)", at, werr, m.Asleep())
				}
				faultExact(t, r, tier, 1, fmt.Sprintf("wake failing at restore %d", at))
				if _, err := c.Decode(bg(t), []int32{next}); !errors.Is(err, ErrAsleep) {
					t.Fatalf("a decode after a failed wake: %v", err)
				}
				if err := m.Wake(bg(t)); err != nil {
					t.Fatal(err)
				}
			}
			exactTiers(t, r, tier)
			for range 6 {
				if next, err = c.Decode(bg(t), []int32{next}); err != nil {
					t.Fatal(err)
				}
				got = append(got, next)
			}
			sameTokens(t, fmt.Sprintf("level 1, %s failing at %d", phase, at), got, want)
			if err := c.Close(bg(t)); err != nil {
				t.Fatal(err)
			}
			if done {
				t.Logf("%s: a fault at each of its %d moves, then none", phase, at-1)
				break
			}
		}
	}
}

// exactTiers checks, once the queues drained, that each tier's ledger
// equals its mechanism's bytes and the kernel's.
func exactTiers(t testing.TB, r *rig, tier *hostTier) {
	t.Helper()
	if err := tiersExact(t, r, tier); err != nil {
		t.Fatal(err)
	}
}

// tiersExact is exactTiers's check, returning what differs.
func tiersExact(t testing.TB, r *rig, tier *hostTier) error {
	t.Helper()
	r.settle(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tier.ectx.Queue().Drain(ctx); err != nil {
		return err
	}
	for _, x := range []struct {
		auth memapi.AuthorityID
		m    *cpu.Mechanism
	}{{hostAuth, r.mech}, {offloadAuth, tier.mech}} {
		a, _ := r.g.Authority(x.auth)
		k, err := x.m.KernelBytes()
		if err != nil {
			return err
		}
		if a.Charged != x.m.UsedBytes() || a.Charged != k || a.Reserved != 0 || a.Pending != 0 {
			return fmt.Errorf("%s charged %d reserved %d pending %d, mechanism %d, kernel %d", x.auth, a.Charged, a.Reserved, a.Pending, x.m.UsedBytes(), k)
		}
	}
	return nil
}

// The sleep and wake tests log their figures as lines "sleepwake: ...",
// which `scripts/llamacpp.sh sleepwake` gathers into its summary line:
// the device ledger's drop at a sleep of each level (level1-freed,
// level2-freed: a percentage of the weights and KV charged before), one
// tokens-identical line per comparison of tokens across a sleep, and one
// fault line per injected fault, saying whether the ledger was exact
// after it.

// sameTokens logs the comparison of the tokens got across a sleep with an
// uninterrupted run's, and fails the test when they differ.
func sameTokens(t testing.TB, what string, got, want []int32) {
	t.Helper()
	ok := len(want) > 0 && slices.Equal(got, want)
	t.Logf("sleepwake: tokens-identical=%s (%s, %d tokens)", yesNo(ok), what, len(got))
	if !ok {
		t.Fatalf("%s: tokens %v\nwant %v", what, got, want)
	}
}

// faultExact checks the ledger of both tiers after an injected fault,
// logs it, and fails the test when it is not exact.
func faultExact(t testing.TB, r *rig, tier *hostTier, level int, what string) {
	t.Helper()
	err := tiersExact(t, r, tier)
	t.Logf("sleepwake: fault level=%d exact=%s (%s)", level, yesNo(err == nil), what)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// freedPercent logs the device ledger's drop at a sleep of level as a
// percentage of the weights and KV charged before it.
func freedPercent(t testing.TB, level int, freed, before memapi.Bytes) float64 {
	t.Helper()
	pct := 100 * float64(freed) / float64(before)
	t.Logf("sleepwake: level%d-freed=%.1f (%d of %d bytes)", level, pct, freed, before)
	return pct
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
