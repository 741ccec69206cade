package xproc

import (
	"errors"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"

	"github.com/memgen/memgen/governor"
)

// The CUDA mechanism's pool (its default: 4 chunks, 2 of them spares) is
// kept in its process's slot while it is open, so the claims cover it; a
// ledger without room for it makes the mechanism refuse to start, having
// taken nothing on the device; Close gives the bytes back.
func TestPrivateBytesOfThePool(t *testing.T) {
	path := ledgerPath(t)
	l, a, g := member(t, path, 0, Options{Create: &CreateOptions{Capacity: 12 * chunk, Slots: 4}, Poll: time.Hour})
	sim := cudasim.New(cudasim.Config{Memory: 1 << 30})
	m, err := cuda.New(cuda.Config{Driver: sim.Table(), Authority: "dev", Private: a})
	if err != nil {
		t.Fatal(err)
	}
	h, s := inspect(t, path)
	if s[l.slot].Private != uint64(m.PoolLimit()) || h.Private != uint64(m.PoolLimit()) || h.Claimed != uint64(m.PoolLimit()) || m.PoolLimit() != 4*chunk {
		t.Fatalf("with the mechanism open: %v, shared %+v, pool limit %d", s[l.slot], h, m.PoolLimit())
	}
	// The pool is not the authority's: a reservation gets the rest, and
	// a settle keeps the pool in the claim.
	ls := take(t, a, 8*chunk)
	if err := a.Settle(); err != nil {
		t.Fatal(err)
	}
	if h, s := inspect(t, path); s[l.slot].Claim != 12*chunk || h.Claimed != 12*chunk || s[l.slot].Charged != 8*chunk {
		t.Fatalf("settled with the pool kept: %v, shared %+v", s[l.slot], h)
	}
	if _, err := a.Reserve(contextBG, governor.Request{Holder: "h", Role: "r", Bytes: 1}); !errors.Is(err, memapi.ErrOverBudget) {
		t.Fatalf("beyond the capacity less the pool: %v", err)
	}
	if sn, _ := g.Authority("dev"); sn.Capacity != 8*chunk {
		t.Fatalf("local capacity %d, want the claim less the pool", sn.Capacity)
	}
	// No room for a second mechanism's pool: it refuses to start.
	free := sim.Stats().Used
	if _, err := cuda.New(cuda.Config{Driver: sim.Table(), Authority: "dev", Private: a}); !errors.Is(err, memapi.ErrOverBudget) {
		t.Fatalf("a second pool without room: %v, want ErrOverBudget", err)
	}
	if used := sim.Stats().Used; used != free {
		t.Fatalf("the refused mechanism took %d bytes of the device", used-free)
	}
	_ = ls.Refund(8 * chunk)
	if err := l.Close(); !errors.Is(err, errInUse) {
		t.Fatalf("Close with the pool kept: %v, want ErrInUse", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Settle(); err != nil {
		t.Fatal(err)
	}
	if h, _ := inspect(t, path); h.Claimed != 0 || h.Private != 0 {
		t.Fatalf("after the mechanism closed: %+v", h)
	}
}

// With the default configuration (no Config.Private) the pool is in the
// ledger all the same, whichever starts first: a mechanism opened after
// Bind keeps it in the bound authority's slot; one opened before is
// claimed by Bind; a Bind with no room for it fails with the typed
// refusal and binds nothing.
func TestPoolInTheLedgerByDefault(t *testing.T) {
	sim := cudasim.New(cudasim.Config{Memory: 1 << 30})
	for _, order := range []string{"bind first", "mechanism first"} {
		t.Run(order, func(t *testing.T) {
			path := ledgerPath(t)
			var l *Ledger
			var m *cuda.Mechanism
			var err error
			if order == "mechanism first" {
				if m, err = cuda.New(cuda.Config{Driver: sim.Table(), Authority: "dev"}); err != nil {
					t.Fatal(err)
				}
				l, _, _ = member(t, path, 0, Options{Create: &CreateOptions{Capacity: 12 * chunk, Slots: 4}, Poll: time.Hour})
			} else {
				l, _, _ = member(t, path, 0, Options{Create: &CreateOptions{Capacity: 12 * chunk, Slots: 4}, Poll: time.Hour})
				if m, err = cuda.New(cuda.Config{Driver: sim.Table(), Authority: "dev"}); err != nil {
					t.Fatal(err)
				}
			}
			h, s := inspect(t, path)
			if s[l.slot].Private != uint64(m.PoolLimit()) || h.Private != uint64(m.PoolLimit()) || m.PoolLimit() == 0 {
				t.Fatalf("%s: slot %v, shared %+v, pool limit %d", order, s[l.slot], h, m.PoolLimit())
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			if h, _ := inspect(t, path); h.Claimed != 0 || h.Private != 0 {
				t.Fatalf("after the mechanism closed: %+v", h)
			}
		})
	}
	t.Run("no room", func(t *testing.T) {
		m, err := cuda.New(cuda.Config{Driver: sim.Table(), Authority: "dev"})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		path := ledgerPath(t)
		l, err := Open(path, Options{Create: &CreateOptions{Capacity: chunk, Slots: 4}, Poll: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		g := governor.New(governor.Options{})
		defer g.Close()
		if err := l.Bind(g, "dev"); !errors.Is(err, memapi.ErrOverBudget) {
			t.Fatalf("Bind with no room for the pool: %v, want ErrOverBudget", err)
		}
		if _, ok := g.Authority("dev"); ok {
			t.Fatal("the refused Bind left its authority in the governor")
		}
		if h, _ := inspect(t, path); h.Claimed != 0 || h.Private != 0 {
			t.Fatalf("the refused Bind left %+v", h)
		}
	})
}
