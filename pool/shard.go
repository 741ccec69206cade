package pool

import (
	"math/rand/v2"
	"sync"
)

// shard is one of the pool's caches of free small blocks. A small Alloc or
// Free locks one shard, picked by a cheap per-call random number, and no
// pool-wide lock: with more shards than processors two goroutines seldom
// meet. An empty shard refills from the pool's depot; a full one spills
// half its blocks there (Go's mcache and mcentral, mimalloc's pages).
type shard struct {
	mu     sync.Mutex
	lists  [numClasses]freeList
	allocs uint64
	frees  uint64
	t      tally    // its share of the bytes in use and requested
	_      [64]byte // keeps shards on their own cache lines
}

// shardKeep is the bytes of one class a shard keeps before it spills half
// to the depot, and about what a refill moves: bounded in bytes, so that
// large classes are not stranded in idle shards.
const shardKeep = 256 << 10

// shardMax is how many blocks of class c a shard keeps (1 to 64).
func shardMax(c int) int { return int(min(64, max(1, shardKeep/classSize[c]))) }

// pick returns the shard for this call. The hint is a sync.Pool, whose Get
// and Put are per-P and lock-free: a goroutine keeps meeting the shard of
// its P, so what it frees it allocates again from the same cache. The hint
// only names shards (all of them stay in p.shards, so a garbage collection
// that empties the sync.Pool loses no block); when it is empty a shard is
// picked by a cheap random number.
func (p *Pool) pick() *shard {
	if sh, ok := p.hint.Get().(*shard); ok {
		return sh
	}
	return &p.shards[rand.Uint32()&p.mask]
}

// unpick gives the shard back to the hint.
func (p *Pool) unpick(sh *shard) { p.hint.Put(sh) }
