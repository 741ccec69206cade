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

const (
	shardMax  = 64 // blocks per class a shard keeps before spilling half
	refillMax = 16 // blocks per class a refill moves from the depot
)

func (p *Pool) pick() *shard { return &p.shards[rand.Uint32()&p.mask] }
