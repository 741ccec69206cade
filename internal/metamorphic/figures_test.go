package metamorphic

import (
	"fmt"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cpu"
)

// figures are what a backend's books say after a step.
type figures struct {
	used, drawn, refunded memapi.Bytes
}

func (f figures) String() string {
	return fmt.Sprintf("used %d, drawn %d, refunded %d", f.used, f.drawn, f.refunded)
}

// checkFigures fails the sequence unless the three backends' books agree
// after the step: UsedBytes, the grant's drawn bytes, the account's refunded
// bytes, CommittedBytes of every live reservation, ViewCount of every live
// backing, and every handle's liveness. Each backend's books must also add
// up: drawn - refunded = UsedBytes = the live allocations, committed bytes
// and backings, and what the backend holds (checkHeld).
func (w *world) checkFigures() {
	t := w.t
	var fig [nBackends]figures
	for i, b := range w.b {
		fig[i] = figures{used: b.m.UsedBytes(), drawn: b.grant.Drawn(), refunded: b.account.Refunded()}
		if fig[i].drawn-fig[i].refunded != fig[i].used {
			t.Fatalf("after #%d, %s: %v: drawn - refunded is not UsedBytes", w.step, b.name, fig[i])
		}
	}
	if fig[0] != fig[1] || fig[1] != fig[2] {
		t.Fatalf("after #%d: fakes %v; cpu %v; cuda %v", w.step, fig[0], fig[1], fig[2])
	}
	var held memapi.Bytes
	for _, o := range w.allocs {
		w.liveness(o.name, o.live, o.h[0].Live(), o.h[1].Live(), o.h[2].Live())
		if o.live {
			held += o.h[fakeB].Size()
		}
	}
	for _, o := range w.ress {
		w.liveness(o.name, o.live, o.h[0].Live(), o.h[1].Live(), o.h[2].Live())
		if !o.live {
			continue
		}
		var c [nBackends]memapi.Bytes
		for i, b := range w.b {
			n, err := b.vb.CommittedBytes(o.h[i])
			if err != nil {
				t.Fatalf("after #%d, %s: CommittedBytes(%s): %v", w.step, b.name, o.name, err)
			}
			c[i] = n
		}
		if c[0] != c[1] || c[1] != c[2] {
			t.Fatalf("after #%d: CommittedBytes(%s): fakes %d, cpu %d, cuda %d", w.step, o.name, c[0], c[1], c[2])
		}
		held += c[0]
	}
	for _, o := range w.backs {
		w.liveness(o.name, o.live, o.h[0].Live(), o.h[1].Live(), o.h[2].Live())
		if !o.live {
			continue
		}
		var c [nBackends]int
		for i, b := range w.b {
			n, err := b.sm.ViewCount(o.h[i])
			if err != nil {
				t.Fatalf("after #%d, %s: ViewCount(%s): %v", w.step, b.name, o.name, err)
			}
			c[i] = n
		}
		if c[0] != c[1] || c[1] != c[2] {
			t.Fatalf("after #%d: ViewCount(%s): fakes %d, cpu %d, cuda %d", w.step, o.name, c[0], c[1], c[2])
		}
		held += o.h[fakeB].Size()
	}
	for _, o := range w.views {
		w.liveness(o.name, o.live, o.h[0].Live(), o.h[1].Live(), o.h[2].Live())
	}
	if held != fig[0].used {
		t.Fatalf("after #%d: UsedBytes %d, but the live handles hold %d", w.step, fig[0].used, held)
	}
	w.checkHeld(fig[0].used)
}

// checkHeld fails the sequence unless what each backend really holds is
// what its books say: the fakes' live handles are the sequence's, the
// kernel's figure for the CPU mechanism's memory (mincore, memfd blocks) and
// the simulated device's memory in use are UsedBytes.
func (w *world) checkHeld(used memapi.Bytes) {
	t := w.t
	live := 0
	for _, o := range w.allocs {
		live += count(o.live)
	}
	for _, o := range w.ress {
		live += count(o.live)
	}
	for _, o := range w.backs {
		live += count(o.live)
	}
	for _, o := range w.views {
		live += count(o.live)
	}
	if n := w.b[fakeB].fake.LiveHandles(); n != live {
		t.Fatalf("after #%d: the fakes hold %d live handles, the sequence %d", w.step, n, live)
	}
	k, err := w.b[cpuB].cpu.KernelBytes()
	if err != nil {
		t.Fatalf("after #%d: cpu: KernelBytes: %v", w.step, err)
	}
	if k != used {
		t.Fatalf("after #%d: cpu: the kernel holds %d bytes for UsedBytes %d", w.step, k, used)
	}
	if d := w.b[cudaB].sim.Stats().Used; memapi.Bytes(d) != used {
		t.Fatalf("after #%d: cuda: the simulated device has %d bytes in use for UsedBytes %d", w.step, d, used)
	}
}

func count(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (w *world) liveness(name string, want bool, got ...bool) {
	for i, g := range got {
		if g != want {
			w.t.Fatalf("after #%d: %s's %s is live=%v, want %v", w.step, backendNames[i], name, g, want)
		}
	}
}

// releaseAll releases every live handle, views first, through the same
// operations (so they are compared too), and each must succeed.
func (w *world) releaseAll() {
	must := func(out [nBackends]outcome) {
		if !ok(out) {
			w.t.Fatalf("releasing what is left: %v", out[fakeB])
		}
	}
	for _, o := range w.views {
		if o.live {
			r := ref[*memapi.View]{desc: o.name, obj: o}
			out := w.apply(&op{name: fmt.Sprintf("UnmapView(%s)", o.name), run: func(i int) (any, error) {
				return nil, w.b[i].sm.UnmapView(bg, r.at(i))
			}})
			must(out)
			o.live = false
		}
	}
	for _, o := range w.backs {
		if o.live {
			r := ref[*memapi.Backing]{desc: o.name, obj: o}
			out := w.apply(&op{name: fmt.Sprintf("ReleaseBacking(%s)", o.name), run: func(i int) (any, error) {
				return nil, w.b[i].sm.ReleaseBacking(bg, r.at(i), w.b[i].account)
			}})
			must(out)
			o.live = false
		}
	}
	for _, o := range w.ress {
		if o.live {
			r := ref[*memapi.Reservation]{desc: o.name, obj: o}
			out := w.apply(&op{name: fmt.Sprintf("ReleaseReservation(%s)", o.name), run: func(i int) (any, error) {
				return nil, w.b[i].vb.ReleaseReservation(bg, r.at(i), w.b[i].account)
			}})
			must(out)
			o.live = false
		}
	}
	for _, o := range w.allocs {
		if o.live {
			r := ref[*memapi.Allocation]{desc: o.name, obj: o}
			out := w.apply(&op{name: fmt.Sprintf("Free(%s)", o.name), run: func(i int) (any, error) {
				return nil, w.b[i].m.Free(bg, r.at(i), w.b[i].account)
			}})
			must(out)
			o.live = false
		}
	}
	w.checkFigures()
}

// checkEmpty fails the sequence unless, with everything released, nothing is
// held anywhere: UsedBytes 0, every byte drawn refunded, no live handle in the
// fakes, nothing mapped by the CPU mechanism, nothing live in the simulator,
// and the CUDA mechanism closes without reporting a leak.
func (w *world) checkEmpty() {
	t := w.t
	for _, b := range w.b {
		if u := b.m.UsedBytes(); u != 0 {
			t.Fatalf("%s: UsedBytes %d after releasing everything", b.name, u)
		}
		if d, r := b.grant.Drawn(), b.account.Refunded(); d != r {
			t.Fatalf("%s: drew %d, refunded %d", b.name, d, r)
		}
	}
	if n := w.b[fakeB].fake.LiveHandles(); n != 0 {
		t.Fatalf("fakes: %d live handles after releasing everything", n)
	}
	if s := w.b[cpuB].cpu.Stats(); s != (cpu.Stats{}) {
		t.Fatalf("cpu: holds %+v after releasing everything", s)
	}
	if s := w.b[cudaB].sim.Stats(); s.Used != 0 || s.Blocks != 0 || s.Handles != 0 || s.Mappings != 0 || s.Reservations != 0 {
		t.Fatalf("cuda: the simulator holds %+v after releasing everything", s)
	}
	w.done = true
	if err := w.b[cudaB].cuda.Close(); err != nil {
		t.Fatalf("cuda: Close: %v", err)
	}
}

// teardown releases what a failed sequence left, as far as it can, so that
// the next one (rapid replays many while it shrinks) starts clean: the CUDA
// mechanism's Close releases everything; the CPU mechanism's handles are
// released one by one.
func (w *world) teardown() {
	if w.done {
		return
	}
	if b := w.b[cpuB]; b != nil {
		for _, o := range w.views {
			_ = b.sm.UnmapView(bg, o.h[cpuB])
		}
		for _, o := range w.backs {
			_ = b.sm.ReleaseBacking(bg, o.h[cpuB], b.account)
		}
		for _, o := range w.ress {
			_ = b.vb.ReleaseReservation(bg, o.h[cpuB], b.account)
		}
		for _, o := range w.allocs {
			_ = b.m.Free(bg, o.h[cpuB], b.account)
		}
	}
	if b := w.b[cudaB]; b != nil && b.cuda != nil {
		_ = b.cuda.Close()
	}
}
