package ort

import (
	"sync"

	"github.com/memgen/memgen/pmm"
)

// addrShards is the number of shards of an addrMap: enough that ONNX
// Runtime's intra-op threads rarely meet on one lock.
const addrShards = 64

// addrMap maps the address ONNX Runtime holds to the buffer behind it, so
// that Free finds the buffer in O(1). It is sharded by address to keep Alloc
// and Free on different threads off one lock.
type addrMap struct {
	shards [addrShards]addrShard
}

type addrShard struct {
	mu sync.Mutex
	m  map[uint64]*pmm.Buffer
	_  [40]byte // keep shards on separate cache lines
}

func shardOf(addr uint64) int {
	// Buffers are page-aligned: drop the page offset, then mix (Fibonacci
	// hashing) so neighbouring pages land on different shards.
	return int(((addr >> 12) * 0x9E3779B97F4A7C15) >> (64 - 6))
}

func (m *addrMap) put(addr uint64, b *pmm.Buffer) {
	s := &m.shards[shardOf(addr)]
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[uint64]*pmm.Buffer)
	}
	s.m[addr] = b
	s.mu.Unlock()
}

// take removes and returns the buffer at addr, nil when there is none.
func (m *addrMap) take(addr uint64) *pmm.Buffer {
	s := &m.shards[shardOf(addr)]
	s.mu.Lock()
	b, ok := s.m[addr]
	if ok {
		delete(s.m, addr)
	}
	s.mu.Unlock()
	return b
}

// len counts the buffers in the map.
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
