package plugin

import (
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxArgs is the most integer arguments a slot takes (map_view's six).
const maxArgs = 6

// cArgs is the block cCall hands to the C function's call: the function,
// its arguments (unused ones zero) and its result. Its layout is the
// trampoline's (call_amd64.s).
type cArgs struct {
	fn uintptr
	a  [maxArgs]uintptr
	r  uintptr
}

// beforeCall, when set, runs on the Go side of every call before the C
// function: a test puts a function that panics there.
var beforeCall func(fn uintptr)

// callC calls the C function fn with args and returns its integer result.
// A panic on the Go side of the call (in the binding, or in a Go function a
// test installs) is contained and returned as an error; a fault inside the
// C function cannot be contained in-process and ends it.
//
// Pointers converted to uintptr in the call expression stay alive and in
// place for the call (go:uintptrescapes, as for purego.SyscallN); that puts
// what they point to, and the argument list, on the heap.
//
//go:uintptrescapes
func callC(fn uintptr, args ...uintptr) (uintptr, error) { return callInts(fn, args...) }

// callInts is callC for arguments that point to no Go memory: ids, sizes,
// the instance pointer and addresses of C or mapped memory (or pointers
// that a caller marked go:uintptrescapes keeps for the call). Nothing
// escapes, so a call allocates nothing.
func callInts(fn uintptr, args ...uintptr) (r uintptr, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic while calling the plugin: %v", p)
		}
	}()
	if fn == 0 {
		panic("a nil function pointer")
	}
	if len(args) > maxArgs {
		panic(fmt.Sprintf("%d arguments, more than a slot takes (%d)", len(args), maxArgs))
	}
	if beforeCall != nil {
		beforeCall(fn)
	}
	a := cArgs{fn: fn}
	//lint:ignore S1001 six words at most: a loop costs less than copy's call to memmove
	for i, v := range args {
		a.a[i] = v
	}
	cCall(&a)
	return a.r, nil
}

// lockThread and unlockThread pin the goroutine to its OS thread around a
// slot and the last_error call that reads the slot's thread-local message.
func lockThread()   { runtime.LockOSThread() }
func unlockThread() { runtime.UnlockOSThread() }

// monoBase and timeBase are one moment on CLOCK_MONOTONIC and on Go's clock,
// read together once. Go's monotonic clock is CLOCK_MONOTONIC on Linux, and
// time.Since(timeBase) reads only that clock (one vDSO read, no wall
// clock), so a slot's window is kept as offsets from timeBase and its
// deadline_ns is monoBase plus the offset of its end.
var monoBase, timeBase = func() (uint64, time.Time) {
	var ts unix.Timespec
	t := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, t
	}
	return uint64(ts.Nano()), t
}()

// window is a consuming slot's time: when it started and the deadline it
// was given, as offsets from timeBase on the monotonic clock.
type window struct{ start, end time.Duration }

// ns is the window's end on CLOCK_MONOTONIC in nanoseconds, the clock of
// deadline_ns.
func (w window) ns() uint64 { return monoBase + uint64(w.end) }

// passed reports whether the window's deadline has passed.
func (w window) passed() bool { return time.Since(timeBase) > w.end }

// ptr turns an address the plugin returned into a pointer without tripping
// vet's unsafeptr check: the memory is the plugin's static data, never Go's.
func ptr(addr uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&addr)) }

// readStruct copies the first min(size, len(dst)) bytes of the C struct at
// addr into dst: members past the plugin's struct_size stay zero (absent),
// members past this host's struct are ignored.
func readStruct(dst []byte, addr uintptr, size uint32) {
	n := min(int(size), len(dst))
	copy(dst[:n], unsafe.Slice((*byte)(ptr(addr)), n))
}

// bytesOf views a Go struct as bytes, for readStruct.
func bytesOf[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

// maxName bounds how far cString reads.
const maxName = 64

// cString copies the NUL-terminated string at addr, or reports false when
// there is none within maxName bytes.
func cString(addr uintptr) (string, bool) {
	if addr == 0 {
		return "", false
	}
	var b []byte
	for i := range maxName {
		c := *(*byte)(unsafe.Add(ptr(addr), i))
		if c == 0 {
			return string(b), true
		}
		b = append(b, c)
	}
	return "", false
}
