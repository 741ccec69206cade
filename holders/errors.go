package holders

import (
	"fmt"

	"github.com/memgen/memgen/generated/memapi"
)

// errPreempted is the kind of error a call on a preempted request returns:
// the store freed its memory under pressure and put it on the requeue list.
// KVStore.Resume admits it again. It matches memapi.ErrReleased (errors.Is):
// the request's memory is gone, and its State is Preempted.
var errPreempted = fmt.Errorf("holders: request preempted: %w", memapi.ErrReleased)
