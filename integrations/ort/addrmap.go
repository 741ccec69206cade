package ort

import (
	"sync"

	"github.com/memgen/memgen/pmm"
	"github.com/memgen/memgen/pool"
)

// addrShards is the number of shards of an addrMap: enough that ONNX
// Runtime's intra-op threads rarely meet on one lock.
const addrShards = 64

// held is what stands behind an address ONNX Runtime holds: a pool block
// (Alloc) or a whole buffer of the binding (Reserve). Exactly one is set.
type held struct {
	blk pool.Block
	buf *pmm.Buffer
}

// size is the bytes it occupies: the block's rounded size, the buffer's
// physical size.
func (h held) size() int64 {
	if h.buf != nil {
		return int64(h.buf.Size())
	}
	return int64(h.blk.Rounded())
}

// addrMap maps the address ONNX Runtime holds to what stands behind it, so
// that Free finds it in O(1). It is sharded by address to keep Alloc and
// Free on different threads off one lock; each shard is an open-addressing
// table (linear probing, backward-shift deletion: no tombstones), whose
// values are plain structs (a pool.Block is a value), so a put costs no
// heap allocation once a shard has grown to the blocks live in it at once.
type addrMap struct {
	shards [addrShards]addrShard
}

type addrShard struct {
	mu    sync.Mutex
	slots []addrSlot // a power of two long; addr 0 marks an empty slot
	shift uint       // 64 - log2(len(slots))
	n     int
	// What went through the shard: counted under its lock, so that the
	// hot path pays no atomic add for the allocator's counters.
	allocs, reserves, frees uint64
	_                       [56]byte // keep shards on separate cache lines (128 bytes each)
}

type addrSlot struct {
	addr uint64
	h    held
}

// mix spreads an address (256-byte aligned: the low bits carry nothing)
// over 64 bits (Fibonacci hashing); its top bits pick the shard, the next
// ones the slot.
func mix(addr uint64) uint64 { return (addr >> 8) * 0x9E3779B97F4A7C15 }

func shardOf(addr uint64) int { return int(mix(addr) >> (64 - 6)) }

func (s *addrShard) home(addr uint64) int { return int((mix(addr) << 6) >> s.shift) }

// put records h at addr (not present: every address is put once between
// takes).
func (m *addrMap) put(addr uint64, h held) {
	s := &m.shards[shardOf(addr)]
	s.mu.Lock()
	if 2*(s.n+1) > len(s.slots) { // at most half full
		s.grow()
	}
	s.insert(addr, h)
	s.n++
	if h.buf != nil {
		s.reserves++
	} else {
		s.allocs++
	}
	s.mu.Unlock()
}

// unfree puts back what take took, for a Free that failed: it is counted
// neither as a new allocation nor as a free (counted says take counted it).
func (m *addrMap) unfree(addr uint64, h held, counted bool) {
	s := &m.shards[shardOf(addr)]
	s.mu.Lock()
	if 2*(s.n+1) > len(s.slots) {
		s.grow()
	}
	s.insert(addr, h)
	s.n++
	if counted {
		s.frees--
	}
	s.mu.Unlock()
}

func (s *addrShard) insert(addr uint64, h held) {
	mask := len(s.slots) - 1
	i := s.home(addr)
	for s.slots[i].addr != 0 {
		i = (i + 1) & mask
	}
	s.slots[i] = addrSlot{addr: addr, h: h}
}

func (s *addrShard) grow() {
	old := s.slots
	n := max(16, 2*len(old))
	s.slots = make([]addrSlot, n)
	s.shift = 64
	for 1<<(64-s.shift) < n {
		s.shift--
	}
	for _, e := range old {
		if e.addr != 0 {
			s.insert(e.addr, e.h)
		}
	}
}

// take removes and returns what stands at addr; false when nothing does.
// count says whether it is a Free of ONNX Runtime's (counted in frees) or
// the front cache's drain.
func (m *addrMap) take(addr uint64, count bool) (held, bool) {
	if addr == 0 {
		return held{}, false
	}
	s := &m.shards[shardOf(addr)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.slots) == 0 {
		return held{}, false
	}
	mask := len(s.slots) - 1
	i := s.home(addr)
	for s.slots[i].addr != addr {
		if s.slots[i].addr == 0 {
			return held{}, false
		}
		i = (i + 1) & mask
	}
	h := s.slots[i].h
	// Backward-shift deletion: move later entries of the probe run into
	// the hole when their home does not lie after it.
	for j := (i + 1) & mask; s.slots[j].addr != 0; j = (j + 1) & mask {
		k := s.home(s.slots[j].addr)
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
	s.slots[i] = addrSlot{}
	s.n--
	if count {
		s.frees++
	}
	return h, true
}

// len counts the addresses in the map.
func (m *addrMap) len() int { return m.counts().live }

type mapCounts struct {
	live                    int
	allocs, reserves, frees uint64
}

// counts sums the shards' figures.
func (m *addrMap) counts() (c mapCounts) {
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		c.live += s.n
		c.allocs += s.allocs
		c.reserves += s.reserves
		c.frees += s.frees
		s.mu.Unlock()
	}
	return c
}
