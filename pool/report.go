package pool

import (
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

var _ governor.CacheReporter = (*Pool)(nil)

// CachedBytes reports the pool's cached bytes on authority a
// (governor.CacheReporter): Stats().Cached, the bytes its segments hold
// that no block in use occupies (free chunks, free slab blocks, and
// blocks freed behind fences that have not completed), on its binding's
// authority, and 0 on any other. The governor's snapshots then show the
// holder's charge split into in use and cached. It takes the pool's locks
// as Stats does, never the governor's, and is safe while the pool grows
// or reclaims.
func (p *Pool) CachedBytes(a memapi.AuthorityID) memapi.Bytes {
	if own, err := p.bind.Authority(); err != nil || own != a {
		return 0
	}
	return p.Stats().Cached
}
