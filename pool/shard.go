package pool

import (
	"sync"
	_ "unsafe" // go:linkname
)

// shard is one of the pool's caches of free small blocks. A small Alloc or
// Free locks one shard, the caller's P's (pick), and no pool-wide lock:
// goroutines running at once never meet on one. An empty shard refills
// from the pool's depot; a full one spills half its blocks there (Go's
// mcache and mcentral, mimalloc's pages). Its lock, mu, guards its lists,
// counts and tally; the shards' locks come after every level's (depot.go)
// and are taken together in index order only (lockShards).
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

// pick returns the shard of the caller's P: a goroutine keeps meeting the
// same shard while it runs on the same P, so what it frees it allocates
// again from the same cache, and goroutines running at once on different
// Ps never share one. The P is only a hint: the goroutine may move to
// another P as soon as pick returns, which costs a colder cache, never
// correctness (every shard has its own lock). Two Ps share a shard only
// when GOMAXPROCS grows past the shards New made.
//
// The P's id comes from runtime.procPin (pinning and unpinning at once).
// It is an internal of the runtime that the runtime keeps linkable for the
// packages that use it (its declaration says so), and the cheapest per-P
// index a Go program has: the sync.Pool this pool used before pins twice
// per call (Get and Put), about 30 ns of a 50 ns Alloc+Free in
// BenchmarkSmallAllocFree.
func (p *Pool) pick() *shard {
	id := procPin()
	procUnpin()
	return &p.shards[uint32(id)&p.mask]
}

//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()
