package cuda

import "sort"

// region is one address range the mechanism owns: a cuMemAlloc block or a
// reservation. The device context consults the index before every copy, so a
// copy never reaches the driver with an address the mechanism would let it
// fault on (a fault is sticky on a GPU: it ends the context).
type region struct {
	start, end uint64
	alloc      *allocState
	res        *resState
}

// regions is sorted by start; regions never overlap.
type regions []region

func (rs regions) search(addr uint64) int {
	return sort.Search(len(rs), func(i int) bool { return rs[i].start > addr }) - 1
}

// find returns the region holding addr, or nil.
func (rs regions) find(addr uint64) *region {
	i := rs.search(addr)
	if i >= 0 && addr < rs[i].end {
		return &rs[i]
	}
	return nil
}

func (rs *regions) insert(r region) {
	i := rs.search(r.start) + 1
	*rs = append(*rs, region{})
	copy((*rs)[i+1:], (*rs)[i:])
	(*rs)[i] = r
}

func (rs *regions) remove(start uint64) {
	i := rs.search(start)
	if i >= 0 && (*rs)[i].start == start {
		*rs = append((*rs)[:i], (*rs)[i+1:]...)
	}
}
