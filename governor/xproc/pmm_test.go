package xproc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

// pmmOn wires a pmm manager over g with a CPU mechanism drawing on
// authority and returns holder h's binding for role r, its mechanism and
// its device context (closed, waiting for its frees, at cleanup or by the
// caller).
func pmmOn(g *governor.Governor, authority memapi.AuthorityID) (*pmm.Binding, *cpu.Mechanism, *ep.Context, error) {
	mech, err := cpu.New(cpu.Options{Authority: authority, NoHugePages: true})
	if err != nil {
		return nil, nil, nil, err
	}
	ectx := ep.NewContext(cpu.NewContext(mech), ep.Options{})
	mgr := pmm.New(g, pmm.Options{})
	dev := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	if err := mgr.Register(pmm.Device{Key: dev, Mechanism: mech, Context: ectx, Authority: authority}); err != nil {
		return nil, nil, nil, err
	}
	b, err := mgr.Bind("h", "r", dev)
	if err != nil {
		return nil, nil, nil, err
	}
	return b, mech, ectx, nil
}

// pmm reserves through governor.Governor.Reserve, not Authority.Reserve:
// on a shared authority its allocations claim from the ledger, and one the
// ledger cannot cover fails with the ledger's over-budget error before the
// mechanism is called.
func TestPmmClaims(t *testing.T) {
	const capacity = 1 << 20
	path := ledgerPath(t)
	_, a, g := member(t, path, capacity, Options{Poll: time.Hour}) // no settle but ours
	b, mech, ectx, err := pmmOn(g, "dev")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ectx.Close(context.Background(), true) })
	ctx := context.Background()
	buf, err := b.Allocate(ctx, 256<<10)
	if err != nil {
		t.Fatalf("Allocate on the shared authority: %v", err)
	}
	if h, s := inspect(t, path); h.Claimed != 256<<10 || s[0].Claim != 256<<10 {
		t.Fatalf("after Allocate the claim is %d (slot %v), want 256 KiB", h.Claimed, s[0])
	}
	if err := a.Settle(); err != nil {
		t.Fatal(err)
	}
	if h, s := inspect(t, path); s[0].Charged != 256<<10 || h.Charged != uint64(mech.UsedBytes()) {
		t.Fatalf("settled: slot %v, shared %+v, mechanism %d", s[0], h, mech.UsedBytes())
	}

	// Another member holds most of the rest: the ledger, not the local
	// capacity, refuses, and the mechanism is never asked.
	_, other, _ := member(t, path, capacity, Options{Poll: time.Hour})
	ls := take(t, other, 700<<10)
	defer ls.Refund(700 << 10)
	before := mech.Stats().Allocations
	for _, n := range []memapi.Bytes{128 << 10, 2 << 20} {
		_, err = b.Allocate(ctx, n)
		var ob *governor.OverBudgetError
		if !errors.As(err, &ob) || ob.Kind != memapi.ErrOverBudget || ob.Op != "xproc.Reserve" || ob.Capacity != capacity {
			t.Fatalf("Allocate %d beyond the ledger: %v, want the ledger's over-budget error", n, err)
		}
		if got := mech.Stats().Allocations; got != before {
			t.Fatalf("the mechanism was called: %d allocations, had %d", got, before)
		}
	}
	// Governor.Reserve by hand claims the same way.
	gr, err := g.Reserve(ctx, governor.Request{Authority: "dev", Holder: "h", Role: "r", Bytes: 64 << 10})
	if err != nil {
		t.Fatalf("Governor.Reserve on the shared authority: %v", err)
	}
	if h, _ := inspect(t, path); h.Claimed != (256+64+700)<<10 {
		t.Fatalf("after Governor.Reserve: %+v", h)
	}
	_ = gr.Cancel()

	if err := buf.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ectx.Queue().Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Settle(); err != nil {
		t.Fatal(err)
	}
	if _, s := inspect(t, path); s[0].Claim != 0 || s[0].Charged != 0 || mech.UsedBytes() != 0 {
		t.Fatalf("after the free and a settle: slot %v, mechanism %d", s[0], mech.UsedBytes())
	}
}

// childPmm is childReserve through pmm: the allocations come from
// pmm.Binding.Allocate (governor.Governor.Reserve on the shared
// authority) and are freed by Buffer.Close through the deferred-free queue.
func childPmm() error {
	c, err := joinCPU()
	if err != nil {
		return err
	}
	b, mech, ectx, err := pmmOn(c.g, "host")
	if err != nil {
		return err
	}
	fmt.Println("joined")
	waitLine()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed(), 2))
	var hold []*pmm.Buffer
	over := 0
	for range 300 {
		if len(hold) > 0 && rng.IntN(3) == 0 {
			k := rng.IntN(len(hold))
			if err := hold[k].Close(); err != nil {
				return err
			}
			hold = append(hold[:k], hold[k+1:]...)
			if rng.IntN(3) == 0 {
				_ = ectx.Queue().Drain(ctx)
				_ = c.a.Settle()
			}
			continue
		}
		buf, err := b.Allocate(ctx, memapi.Bytes(rng.IntN(16)+1)*16<<10)
		if errors.Is(err, memapi.ErrOverBudget) {
			over++
			continue
		}
		if err != nil {
			return err
		}
		hold = append(hold, buf)
	}
	if err := ectx.Queue().Drain(ctx); err != nil {
		return err
	}
	_ = c.a.Settle()
	s, _ := c.g.Authority("host")
	kb, err := mech.KernelBytes()
	if err != nil {
		return err
	}
	if ub := mech.UsedBytes(); kb != ub || ub != s.Charged || s.Reserved != 0 || s.Pending != 0 {
		return fmt.Errorf("kernel %d, mechanism %d, local ledger charged %d reserved %d pending %d", kb, ub, s.Charged, s.Reserved, s.Pending)
	}
	fmt.Println("quiescent", os.Getpid(), uint64(kb), over)
	waitEOF()
	for _, buf := range hold {
		if err := buf.Close(); err != nil {
			return err
		}
	}
	if err := ectx.Close(ctx, true); err != nil {
		return err
	}
	if err := c.l.Close(); err != nil {
		return err
	}
	c.g.Close()
	fmt.Println("done")
	return nil
}

// Four processes allocate through pmm under one capacity: the same
// invariants as TestEightProcesses, for reservations that never call
// Authority.Reserve.
func TestProcessesThroughPmm(t *testing.T) { processes(t, "pmm", 4, 4<<20) }
