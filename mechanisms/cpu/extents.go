package cpu

import (
	"sort"

	"github.com/memgen/memgen/generated/memapi"
)

// extentKind says what backs an extent of a reservation.
type extentKind uint8

const (
	extCommitted  extentKind = iota + 1 // private pages installed by Commit
	extView                             // a view of a shared backing
	extCommitting                       // a Commit populating it now, outside the lock
)

// extent is a backed stretch [off, end) of a reservation.
type extent struct {
	off, end memapi.Bytes
	kind     extentKind
	view     *view // for extView
}

// extents is the backed part of a reservation: sorted, non-overlapping,
// adjacent committed extents merged. What is not in it is reserved address
// space with no backing (PROT_NONE). A reservation grown in many steps stays
// one extent, so lookups are cheap whatever the granularity.
type extents []extent

// search returns the index of the first extent that ends after off.
func (x extents) search(off memapi.Bytes) int {
	return sort.Search(len(x), func(i int) bool { return x[i].end > off })
}

// free reports whether nothing backs any byte of [off, end).
func (x extents) free(off, end memapi.Bytes) bool {
	i := x.search(off)
	return i == len(x) || x[i].off >= end
}

// committed reports whether private committed pages back every byte of
// [off, end).
func (x extents) committed(off, end memapi.Bytes) bool {
	pos := off
	for i := x.search(off); i < len(x) && x[i].off < end; i++ {
		if x[i].kind != extCommitted || x[i].off > pos {
			return false
		}
		pos = x[i].end
	}
	return pos >= end
}

// insert adds e, which must not overlap any extent, merging it with
// committed neighbours.
func (x extents) insert(e extent) extents {
	i := x.search(e.off)
	if e.kind == extCommitted {
		if i > 0 && x[i-1].kind == extCommitted && x[i-1].end == e.off {
			i--
			e.off = x[i].off
			x = append(x[:i], x[i+1:]...)
		}
		if i < len(x) && x[i].kind == extCommitted && x[i].off == e.end {
			e.end = x[i].end
			x = append(x[:i], x[i+1:]...)
		}
	}
	x = append(x, extent{})
	copy(x[i+1:], x[i:])
	x[i] = e
	return x
}

// cut removes [off, end), which committed extents must cover, splitting
// the extents at its edges.
func (x extents) cut(off, end memapi.Bytes) extents {
	var out extents
	i := x.search(off)
	out = append(out, x[:i]...)
	for ; i < len(x) && x[i].off < end; i++ {
		if x[i].off < off {
			out = append(out, extent{off: x[i].off, end: off, kind: extCommitted})
		}
		if x[i].end > end {
			out = append(out, extent{off: end, end: x[i].end, kind: extCommitted})
		}
	}
	return append(out, x[i:]...)
}

// settle turns the committing extent that starts at off into a committed
// one, merged with committed neighbours, or drops it when ok is false.
func (x extents) settle(off memapi.Bytes, ok bool) extents {
	i := x.search(off)
	e := x[i]
	x = x.remove(i)
	if !ok {
		return x
	}
	e.kind = extCommitted
	return x.insert(e)
}

// find returns the index of the extent that holds view v, or -1.
func (x extents) find(v *view) int {
	i := x.search(v.off)
	if i < len(x) && x[i].view == v {
		return i
	}
	return -1
}

// remove drops the extent at index i.
func (x extents) remove(i int) extents {
	return append(x[:i], x[i+1:]...)
}
