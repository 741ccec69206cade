package holders

import "errors"

// ErrPreempted is the kind of error a call on a preempted request returns:
// the store freed its memory under pressure and put it on the requeue list.
// KVStore.Resume admits it again.
var ErrPreempted = errors.New("holders: request preempted")
