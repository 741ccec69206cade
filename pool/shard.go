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
	_      [64]byte // keeps shards on their own cache lines
}

// shardKeep is the bytes of one class a shard keeps before it spills half
// to the depot, and about what a refill moves: bounded in bytes, so that
// large classes are not stranded in idle shards.
const shardKeep = 256 << 10

// shardMax is how many blocks of class c a shard keeps (2 to 64).
func shardMax(c int) int { return int(min(64, max(2, shardKeep/classSize[c]))) }

func (p *Pool) pick() *shard { return &p.shards[rand.Uint32()&p.mask] }
