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
// Free on different threads off one lock. Its values are plain structs (a
// pool.Block is a value), so a put costs no heap allocation once a shard's
// map has grown to the number of blocks live at once.
type addrMap struct {
	shards [addrShards]addrShard
}

type addrShard struct {
	mu sync.Mutex
	m  map[uint64]held
	_  [40]byte // keep shards on separate cache lines
}

func shardOf(addr uint64) int {
	// Blocks are 256-byte aligned: drop the alignment bits, then mix
	// (Fibonacci hashing) so neighbouring blocks land on different shards.
	return int(((addr >> 8) * 0x9E3779B97F4A7C15) >> (64 - 6))
}

func (m *addrMap) put(addr uint64, h held) {
	s := &m.shards[shardOf(addr)]
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[uint64]held)
	}
	s.m[addr] = h
	s.mu.Unlock()
}

// take removes and returns what stands at addr; false when nothing does.
func (m *addrMap) take(addr uint64) (held, bool) {
	s := &m.shards[shardOf(addr)]
	s.mu.Lock()
	h, ok := s.m[addr]
	if ok {
		delete(s.m, addr)
	}
	s.mu.Unlock()
	return h, ok
}

// len counts the addresses in the map.
func (m *addrMap) len() int {
	n := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}
