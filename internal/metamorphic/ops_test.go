package metamorphic

// The operations a sequence draws: how each draws its arguments, and what
// it records of a success for the steps after it.

import (
	"fmt"
	"slices"
	"strings"

	"pgregory.net/rapid"

	"github.com/memgen/memgen/generated/memapi"
)

// uniform draws one of names with equal chances, and shrinks towards the
// first. (rapid's integers favour the smallest and the largest values, which
// would make the first and last operations of the list far more frequent
// than their weight, and the rare cases of a choice below far less rare.)
func uniform[E any](names []E) *rapid.Generator[E] {
	return rapid.Map(rapid.SliceOfN(rapid.Bool(), 16, 16), func(bits []bool) E {
		v := 0
		for _, b := range bits {
			v <<= 1
			if b {
				v |= 1
			}
		}
		return names[v*len(names)>>16]
	})
}

// tenth draws 0 to 9 with equal chances: the choices of a step, where 0 to
// 5 or 6 are the common case (what rapid shrinks towards) and the rest the
// rarer ones.
var tenth = uniform([]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})

// twentieth draws 0 to 19 with equal chances, as tenth.
var twentieth = uniform([]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19})

// pick draws the handle an operation names: mostly a live one (one that
// prefer accepts, if any does and prefer is not nil), sometimes a released
// one, another instance's, or nil. When there is none of the kind drawn it
// names a live one, else a released one, else nil.
func pick[H memapi.Handle](t *rapid.T, label string, list []*object[H], prefer func(*object[H]) bool) ref[H] {
	var live, dead, preferred []*object[H]
	for _, o := range list {
		switch {
		case !o.live:
			dead = append(dead, o)
		case prefer != nil && prefer(o):
			preferred = append(preferred, o)
			fallthrough
		default:
			live = append(live, o)
		}
	}
	if len(preferred) > 0 {
		live = preferred
	}
	from := func(xs []*object[H]) *object[H] {
		return xs[rapid.IntRange(0, len(xs)-1).Draw(t, label)]
	}
	k := twentieth.Draw(t, label+" kind")
	switch {
	case k == 19:
	case k == 18 && len(list) > 0:
		o := from(list)
		return ref[H]{desc: o.name + " (another instance's)", obj: o, foreign: true}
	case (k == 17 || len(live) == 0) && len(dead) > 0:
		o := from(dead)
		return ref[H]{desc: o.name + " (released)", obj: o}
	case len(live) > 0:
		o := from(live)
		return ref[H]{desc: o.name, obj: o}
	}
	return ref[H]{desc: "nil"}
}

// room returns a preference for reservations with n granules in a row in
// state.
func room(state byte, n int) func(*object[*memapi.Reservation]) bool {
	run := strings.Repeat(string(state), n)
	return func(o *object[*memapi.Reservation]) bool { return strings.Contains(string(o.slots), run) }
}

// drawFault draws, one time in ten, a fault of method at one of the
// simulator's calls (the nth call for the first counted calls, n up to most,
// the number of chunks the operation makes; the first call for the others)
// and at one of the CPU mechanism's kernel calls (the first).
func drawFault(t *rapid.T, method string, calls []string, counted, most int, cpuCalls []string) *fault {
	if tenth.Draw(t, "fault") != 9 {
		return nil
	}
	i := rapid.IntRange(0, len(calls)-1).Draw(t, "fault call")
	f := &fault{method: method, call: calls[i], nth: 1, cpu: uniform(cpuCalls).Draw(t, "fault cpu call")}
	if i < counted && most > 1 {
		f.nth = rapid.IntRange(1, most).Draw(t, "fault nth")
	}
	return f
}

// fmtBytes writes n with the largest unit that divides it.
func fmtBytes(n memapi.Bytes) string {
	switch {
	case n >= 1<<40 && n%(1<<40) == 0:
		return fmt.Sprintf("%dTiB", n>>40)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func fmtRange(r memapi.Range) string {
	if r.Off > 1<<62 {
		return fmt.Sprintf("[2^64-%s, +%s)", fmtBytes(-r.Off), fmtBytes(r.Len))
	}
	return fmt.Sprintf("[%s, +%s)", fmtBytes(r.Off), fmtBytes(r.Len))
}

func roundUp(n, g memapi.Bytes) memapi.Bytes {
	r, ok := memapi.RoundUp(n, g)
	if !ok {
		return 0
	}
	return r
}

// drawSize draws a size: mostly any byte count up to 8 granules (so mostly
// unaligned), sometimes whole granules, zero, more than the capacity, or
// huge.
func drawSize(t *rapid.T, label string) (size memapi.Bytes, huge bool) {
	switch tenth.Draw(t, label+" class") {
	case 6:
		return memapi.Bytes(rapid.IntRange(1, 8).Draw(t, label+" granules")) * gran, false
	case 7:
		return 0, false
	case 8:
		return capacity + memapi.Bytes(rapid.IntRange(1, int(capacity)).Draw(t, label+" past capacity")), false
	case 9:
		return hugeSize, true
	}
	return memapi.Bytes(rapid.IntRange(1, int(8*gran)).Draw(t, label)), false
}

// sizeOf is the size of a reservation or backing an operation names (that of
// another instance's is the same), 4 granules for nil.
func sizeOf[H interface {
	memapi.Handle
	Size() memapi.Bytes
}](r ref[H]) memapi.Bytes {
	if r.obj == nil {
		return 4 * gran
	}
	return r.obj.h[fakeB].Size()
}

// drawRange draws a range of the reservation r names. Mostly a range
// whose granules are all in state want ('.' or 'c'; of length granules when
// length is not 0) where the reservation has one; otherwise, or by choice,
// whole granules anywhere (inside, overlapping, or past the end), half a
// granule off, a page longer, empty, or with an end that overflows.
func drawRange(t *rapid.T, label string, r ref[*memapi.Reservation], want byte, length memapi.Bytes) memapi.Range {
	size := sizeOf(r)
	k := int(size / gran)
	shape := twentieth.Draw(t, label+" shape")
	if shape <= 13 && r.obj != nil {
		var starts []int // granules where a suitable range starts
		for i := range k {
			n := 1
			if length != 0 {
				n = int(length / gran)
			}
			if i+n <= k && !slices.ContainsFunc(r.obj.slots[i:i+n], func(c byte) bool { return c != want }) {
				starts = append(starts, i)
			}
		}
		if len(starts) > 0 {
			i := starts[rapid.IntRange(0, len(starts)-1).Draw(t, label+" start")]
			rg := memapi.Range{Off: memapi.Bytes(i) * gran, Len: length}
			if length == 0 {
				end := i + 1
				for end < k && r.obj.slots[end] == want {
					end++
				}
				rg.Len = memapi.Bytes(rapid.IntRange(1, end-i).Draw(t, label+" granules")) * gran
			}
			return rg
		}
	}
	rg := memapi.Range{Off: memapi.Bytes(rapid.IntRange(0, k).Draw(t, label+" first granule")) * gran}
	if length == 0 {
		rg.Len = memapi.Bytes(rapid.IntRange(1, max(k, 1)).Draw(t, label+" granules")) * gran
	} else {
		rg.Len = length
	}
	switch shape {
	case 16:
		rg.Off += gran / 2
	case 17:
		rg.Len += pageSize
	case 18:
		rg.Len = 0
	case 19:
		rg.Off = ^memapi.Bytes(0) - gran + 1 // Off+Len overflows
	}
	return rg
}

// Actions.

// aligns are the alignments an allocation asks for: mostly none, sometimes
// one every mechanism gives, or one that is not a power of two. (Above 256
// bytes the CUDA mechanism refuses by its documented limit, what cuMemAlloc
// guarantees, where the others align: such alignments are not drawn.)
var aligns = []memapi.Bytes{0, 0, 0, 0, 0, 0, 1, 256, 3, 3 * 4096}

func (w *world) allocate(t *rapid.T) {
	size, huge := drawSize(t, "size")
	align := uniform(aligns).Draw(t, "align")
	f := drawFault(t, "Allocate", []string{"cuMemAlloc"}, 0, 1, []string{"mmap", "madvise"})
	req := memapi.AllocRequest{Size: size, Align: align}
	name := w.name("a")
	out := w.apply(&op{
		name:     fmt.Sprintf("%s = Allocate(%s, align %d)", name, fmtBytes(size), align),
		consumes: roundUp(size, pageSize),
		fault:    f,
		huge:     huge,
		run: func(i int) (any, error) {
			return w.b[i].m.Allocate(bg, req, w.b[i].grant)
		},
		undo: func(i int, made any) error {
			return w.b[i].m.Free(bg, made.(*memapi.Allocation), w.b[i].grant)
		},
	})
	if !ok(out) {
		return
	}
	o := &object[*memapi.Allocation]{name: name, live: true}
	for i := range nBackends {
		o.h[i] = out[i].made.(*memapi.Allocation)
	}
	w.sameSize(name, o.h[0].Size(), o.h[1].Size(), o.h[2].Size(), roundUp(size, pageSize))
	w.allocs = append(w.allocs, o)
}

// sameSize fails the sequence unless every backend's new handle has the
// rounded size.
func (w *world) sameSize(name string, a, b, c, want memapi.Bytes) {
	if a != want || b != want || c != want {
		w.t.Fatalf("%s: sizes fakes %d, cpu %d, cuda %d; want %d", name, a, b, c, want)
	}
}

func (w *world) free(t *rapid.T) {
	r := pick(t, "allocation", w.allocs, nil)
	out := w.apply(&op{
		name: fmt.Sprintf("Free(%s)", r.desc),
		run: func(i int) (any, error) {
			return nil, w.b[i].m.Free(bg, r.at(i), w.b[i].account)
		},
	})
	released(w, out, r.obj, r.own())
}

// released marks o released after a successful release of it.
func released[H memapi.Handle](w *world, out [nBackends]outcome, o *object[H], own bool) {
	if !ok(out) {
		return
	}
	if !own {
		w.t.Fatalf("a release of another instance's handle or nil succeeded")
	}
	o.live = false
}

func (w *world) reserve(t *rapid.T) {
	var size memapi.Bytes
	switch tenth.Draw(t, "size class") {
	case 7:
		size = memapi.Bytes(rapid.IntRange(1, int(8*gran)).Draw(t, "size"))
	case 8:
		size = 0
	case 9:
		size = hugeSize
	default:
		size = memapi.Bytes(rapid.IntRange(1, 12).Draw(t, "granules")) * gran
	}
	f := drawFault(t, "Reserve", []string{"cuMemAddressReserve"}, 0, 1, []string{"mmap"})
	name := w.name("r")
	out := w.apply(&op{
		name:  fmt.Sprintf("%s = Reserve(%s)", name, fmtBytes(size)),
		fault: f,
		run: func(i int) (any, error) {
			return w.b[i].vb.Reserve(bg, memapi.ReserveRequest{Size: size})
		},
		undo: func(i int, made any) error {
			return w.b[i].vb.ReleaseReservation(bg, made.(*memapi.Reservation), w.b[i].grant)
		},
	})
	if !ok(out) {
		return
	}
	o := &object[*memapi.Reservation]{name: name, live: true, slots: []byte(strings.Repeat(".", int(roundUp(size, gran)/gran)))}
	for i := range nBackends {
		o.h[i] = out[i].made.(*memapi.Reservation)
	}
	w.sameSize(name, o.h[0].Size(), o.h[1].Size(), o.h[2].Size(), roundUp(size, gran))
	w.ress = append(w.ress, o)
}

func (w *world) commit(t *rapid.T) {
	r := pick(t, "reservation", w.ress, room('.', 1))
	rg := drawRange(t, "range", r, '.', 0)
	f := drawFault(t, "Commit", []string{"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemsetD8"}, 2, int(rg.Len/gran),
		[]string{"mprotect", "madvise"})
	out := w.apply(&op{
		name:     fmt.Sprintf("Commit(%s, %s)", r.desc, fmtRange(rg)),
		consumes: rg.Len,
		fault:    f,
		run: func(i int) (any, error) {
			return nil, w.b[i].vb.Commit(bg, r.at(i), rg, w.b[i].grant)
		},
		undo: func(i int, _ any) error {
			return w.b[i].vb.Decommit(bg, r.at(i), rg, w.b[i].grant)
		},
	})
	if ok(out) && r.own() {
		r.obj.mark(rg, 'c')
	}
}

func (w *world) decommit(t *rapid.T) {
	r := pick(t, "reservation", w.ress, room('c', 1))
	rg := drawRange(t, "range", r, 'c', 0)
	out := w.apply(&op{
		name: fmt.Sprintf("Decommit(%s, %s)", r.desc, fmtRange(rg)),
		run: func(i int) (any, error) {
			return nil, w.b[i].vb.Decommit(bg, r.at(i), rg, w.b[i].account)
		},
	})
	if ok(out) && r.own() {
		r.obj.mark(rg, '.')
	}
}

func (w *world) releaseReservation(t *rapid.T) {
	r := pick(t, "reservation", w.ress, nil)
	out := w.apply(&op{
		name: fmt.Sprintf("ReleaseReservation(%s)", r.desc),
		run: func(i int) (any, error) {
			return nil, w.b[i].vb.ReleaseReservation(bg, r.at(i), w.b[i].account)
		},
	})
	released(w, out, r.obj, r.own())
}

func (w *world) committedBytes(t *rapid.T) {
	r := pick(t, "reservation", w.ress, nil)
	var got [nBackends]memapi.Bytes
	w.apply(&op{
		name: fmt.Sprintf("CommittedBytes(%s)", r.desc),
		run: func(i int) (any, error) {
			n, err := w.b[i].vb.CommittedBytes(r.at(i))
			got[i] = n
			return nil, err
		},
	})
	if got[0] != got[1] || got[1] != got[2] {
		t.Fatalf("CommittedBytes(%s): fakes %d, cpu %d, cuda %d", r.desc, got[0], got[1], got[2])
	}
}

func (w *world) createBacking(t *rapid.T) {
	size, huge := drawSize(t, "size")
	if !huge && size < 8*gran {
		size = (size + 1) / 2 // at most 4 granules, the room a view finds more often
	}
	f := drawFault(t, "CreateBacking", []string{"cuMemCreate"}, 0, 1, []string{"memfd_create", "ftruncate", "fallocate"})
	name := w.name("b")
	out := w.apply(&op{
		name:     fmt.Sprintf("%s = CreateBacking(%s)", name, fmtBytes(size)),
		consumes: roundUp(size, gran),
		fault:    f,
		huge:     huge,
		run: func(i int) (any, error) {
			return w.b[i].sm.CreateBacking(bg, size, w.b[i].grant)
		},
		undo: func(i int, made any) error {
			return w.b[i].sm.ReleaseBacking(bg, made.(*memapi.Backing), w.b[i].grant)
		},
	})
	if !ok(out) {
		return
	}
	o := &object[*memapi.Backing]{name: name, live: true}
	for i := range nBackends {
		o.h[i] = out[i].made.(*memapi.Backing)
	}
	w.sameSize(name, o.h[0].Size(), o.h[1].Size(), o.h[2].Size(), roundUp(size, gran))
	w.backs = append(w.backs, o)
}

// accesses are the accesses a view asks for: mostly valid ones, sometimes
// one that is not an Access.
var accesses = []memapi.Access{
	memapi.AccessReadWrite, memapi.AccessReadOnly, memapi.AccessReadWrite, memapi.AccessReadOnly,
	memapi.AccessReadWrite, memapi.AccessReadOnly, memapi.AccessReadWrite, memapi.AccessReadOnly,
	0, 3,
}

func (w *world) mapView(t *rapid.T) {
	b := pick(t, "backing", w.backs, nil)
	length := sizeOf(b)
	if b.obj == nil {
		length = gran
	}
	r := pick(t, "reservation", w.ress, room('.', int(length/gran)))
	rg := drawRange(t, "range", r, '.', length)
	if twentieth.Draw(t, "length mismatch") == 19 {
		rg.Len += gran
	}
	access := uniform(accesses).Draw(t, "access")
	f := drawFault(t, "MapView", []string{"cuMemMap", "cuMemSetAccess"}, 0, 1, []string{"mmap"})
	name := w.name("v")
	out := w.apply(&op{
		name:  fmt.Sprintf("%s = MapView(%s, %s, %s, %v)", name, r.desc, fmtRange(rg), b.desc, access),
		fault: f,
		run: func(i int) (any, error) {
			return w.b[i].sm.MapView(bg, r.at(i), rg, b.at(i), access)
		},
		undo: func(i int, made any) error {
			return w.b[i].sm.UnmapView(bg, made.(*memapi.View))
		},
	})
	if !ok(out) {
		return
	}
	if !r.own() || !b.own() {
		t.Fatalf("MapView of another instance's handle or nil succeeded")
	}
	o := &object[*memapi.View]{name: name, live: true, in: r.obj, at: rg}
	for i := range nBackends {
		o.h[i] = out[i].made.(*memapi.View)
	}
	r.obj.mark(rg, 'v')
	w.views = append(w.views, o)
}

func (w *world) unmapView(t *rapid.T) {
	r := pick(t, "view", w.views, nil)
	out := w.apply(&op{
		name: fmt.Sprintf("UnmapView(%s)", r.desc),
		run: func(i int) (any, error) {
			return nil, w.b[i].sm.UnmapView(bg, r.at(i))
		},
	})
	released(w, out, r.obj, r.own())
	if ok(out) {
		r.obj.in.mark(r.obj.at, '.')
	}
}

func (w *world) copyOnWrite(t *rapid.T) {
	r := pick(t, "view", w.views, nil)
	var n memapi.Bytes
	if r.obj != nil {
		n = r.obj.h[fakeB].Range().Len
	}
	f := drawFault(t, "CopyOnWrite", []string{"cuMemCreate"}, 0, 1, []string{"memfd_create", "ftruncate", "pwrite", "mmap"})
	name := w.name("v")
	bname := w.name("b")
	out := w.apply(&op{
		name:         fmt.Sprintf("%s, %s = CopyOnWrite(%s)", name, bname, r.desc),
		consumes:     n,
		fault:        f,
		irreversible: true,
		expectOK:     r.live(),
		run: func(i int) (any, error) {
			return w.b[i].sm.CopyOnWrite(bg, r.at(i), w.b[i].grant)
		},
	})
	if !ok(out) {
		return
	}
	released(w, out, r.obj, r.own())
	v := &object[*memapi.View]{name: name, live: true, in: r.obj.in, at: r.obj.at}
	b := &object[*memapi.Backing]{name: bname, live: true}
	for i := range nBackends {
		v.h[i] = out[i].made.(*memapi.View)
		b.h[i] = v.h[i].Backing()
	}
	w.sameSize(bname, b.h[0].Size(), b.h[1].Size(), b.h[2].Size(), n)
	w.views = append(w.views, v)
	w.backs = append(w.backs, b)
}

func (w *world) releaseBacking(t *rapid.T) {
	r := pick(t, "backing", w.backs, nil)
	out := w.apply(&op{
		name: fmt.Sprintf("ReleaseBacking(%s)", r.desc),
		run: func(i int) (any, error) {
			return nil, w.b[i].sm.ReleaseBacking(bg, r.at(i), w.b[i].account)
		},
	})
	released(w, out, r.obj, r.own())
}

func (w *world) viewCount(t *rapid.T) {
	r := pick(t, "backing", w.backs, nil)
	var got [nBackends]int
	w.apply(&op{
		name: fmt.Sprintf("ViewCount(%s)", r.desc),
		run: func(i int) (any, error) {
			n, err := w.b[i].sm.ViewCount(r.at(i))
			got[i] = n
			return nil, err
		},
	})
	if got[0] != got[1] || got[1] != got[2] {
		t.Fatalf("ViewCount(%s): fakes %d, cpu %d, cuda %d", r.desc, got[0], got[1], got[2])
	}
}
