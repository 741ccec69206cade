package holders

import "errors"

// errPreempted is the kind of error a call on a preempted request returns:
// the store freed its memory under pressure and put it on the requeue list.
// KVStore.Resume admits it again.
var errPreempted = errors.New("holders: request preempted")
