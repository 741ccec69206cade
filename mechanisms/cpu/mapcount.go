package cpu

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"unsafe"

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
	procFile.Lock()
	defer procFile.Unlock()
	n, digits, end := 0, 0, false
	read := procFile.read(&maxMapCountPath[0], func(b []byte) {
		for _, c := range b {
			if end || c < '0' || c > '9' || digits == 18 {
				end = true
				return
			}
			n, digits = n*10+int(c-'0'), digits+1
		}
	})
	return n, read && digits > 0
}

// mapCount counts the process's mappings (the lines of /proc/self/maps).
func mapCount() (int, bool) {
	procFile.Lock()
	defer procFile.Unlock()
	n := 0
	ok := procFile.read(&mapsPath[0], func(b []byte) { n += bytes.Count(b, newline) })
	return n, ok
}

// The files read on an ENOMEM, NUL-terminated for openat.
var (
	maxMapCountPath = []byte("/proc/sys/vm/max_map_count\x00")
	mapsPath        = []byte("/proc/self/maps\x00")
	newline         = []byte{'\n'}
)

// procFile reads a /proc file without allocating: it runs when the
// process is out of memory mappings, where the runtime cannot map more
// heap, so that an allocation that needs it (a few MiB of /proc/self/maps
// read whole did) is a fatal error instead of an error returned.
var procFile procReader

// procReader reads /proc files through one static buffer, under its lock.
type procReader struct {
	sync.Mutex
	buf [16 << 10]byte
}

// read calls each with every chunk of the file at path (NUL-terminated),
// in order; it reports whether the whole file was read. The caller holds
// r's lock; each must not keep the chunk.
func (r *procReader) read(path *byte, each func([]byte)) bool {
	cwd := unix.AT_FDCWD // a variable: the constant is negative
	fd, _, errno := unix.Syscall6(unix.SYS_OPENAT, uintptr(cwd), uintptr(unsafe.Pointer(path)), unix.O_RDONLY|unix.O_CLOEXEC, 0, 0, 0)
	if errno != 0 {
		return false
	}
	defer unix.Close(int(fd))
	for {
		n, err := unix.Read(int(fd), r.buf[:])
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return false
		case n == 0:
			return true
		}
		each(r.buf[:n])
	}
}
