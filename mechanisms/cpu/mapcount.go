package cpu

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/memgen/memgen/generated/memapi"
)

// MapCountError is the cause of an ErrOutOfMemory from Commit when the
// process ran out of memory mappings rather than memory: the kernel refuses
// an mprotect that would split a mapping beyond vm.max_map_count with the
// same ENOMEM it gives for memory. Count is the process's mappings when
// Commit failed and Limit the sysctl. Isolated commits cost two mappings
// each (adjacent ones merge), so the cure is fewer, larger or adjacent
// commits, or a higher vm.max_map_count; not freeing memory.
type MapCountError struct {
	Count, Limit int
	Err          error // the errno
}

func (e *MapCountError) Error() string {
	return fmt.Sprintf("%d memory mappings of at most %d (vm.max_map_count)", e.Count, e.Limit)
}

// Unwrap returns the errno.
func (e *MapCountError) Unwrap() error { return e.Err }

// mapSlack is how close to vm.max_map_count the process must be for an
// ENOMEM to be blamed on it: an mprotect in the middle of a mapping needs
// two more.
const mapSlack = 2

// mapCountCause replaces e's cause by a *MapCountError when err is ENOMEM
// and the process is at vm.max_map_count. It reads /proc only on this
// failure path.
func mapCountCause(e *memapi.Error, err error) {
	if !errors.Is(err, unix.ENOMEM) {
		return
	}
	limit, ok := maxMapCount()
	if !ok {
		return
	}
	count, ok := mapCount()
	if !ok || count+mapSlack < limit {
		return
	}
	e.Err = &MapCountError{Count: count, Limit: limit, Err: err}
	e.Detail = "mprotect read-write: out of memory mappings (vm.max_map_count)"
}

// maxMapCount reads vm.max_map_count.
func maxMapCount() (int, bool) {
	b, err := os.ReadFile("/proc/sys/vm/max_map_count")
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	return n, err == nil
}

// mapCount counts the process's mappings (the lines of /proc/self/maps).
func mapCount() (int, bool) {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, false
	}
	return bytes.Count(b, []byte{'\n'}), true
}
