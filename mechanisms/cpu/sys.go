package cpu

import (
	"errors"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file holds the kernel primitives the mechanism is built from. Each
// wrapper retries EINTR (the Go runtime preempts goroutines with signals, and
// MADV_POPULATE_WRITE returns EINTR when one arrives) and takes pointers into
// mappings that were never Go heap memory.

// madvPopulateWrite is MADV_POPULATE_WRITE (Linux 5.14): fault the range in
// writable now, so that running out of memory is an error here rather than a
// SIGBUS or an OOM kill at first touch.
const madvPopulateWrite = unix.MADV_POPULATE_WRITE

// bytesAt is the mapping at p of n bytes as a slice, for the x/sys calls that
// take []byte. The memory belongs to a mapping, not to the Go heap.
func bytesAt(p unsafe.Pointer, n uintptr) []byte {
	return unsafe.Slice((*byte)(p), n)
}

// mmapAnon maps n bytes of private anonymous memory with prot at a kernel
// chosen address; flags are added to MAP_PRIVATE|MAP_ANONYMOUS.
func mmapAnon(n uintptr, prot, flags int) (unsafe.Pointer, error) {
	return unix.MmapPtr(-1, 0, nil, n, prot, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|flags)
}

// mapReserved replaces [p, p+n) by fresh PROT_NONE address space with no
// backing: it is how a range inside a reservation goes back to "reserved"
// without ever leaving a hole another mapping could take.
func mapReserved(p unsafe.Pointer, n uintptr) error {
	_, err := unix.MmapPtr(-1, 0, p, n, unix.PROT_NONE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE|unix.MAP_FIXED)
	return err
}

// mapShared maps n bytes of fd at exactly p with prot.
func mapShared(p unsafe.Pointer, n uintptr, fd int, prot int) error {
	_, err := unix.MmapPtr(fd, 0, p, n, prot, unix.MAP_SHARED|unix.MAP_FIXED)
	return err
}

func munmap(p unsafe.Pointer, n uintptr) error {
	return unix.MunmapPtr(p, n)
}

func mprotect(p unsafe.Pointer, n uintptr, prot int) error {
	return retry(func() error { return unix.Mprotect(bytesAt(p, n), prot) })
}

func madvise(p unsafe.Pointer, n uintptr, advice int) error {
	return retry(func() error { return unix.Madvise(bytesAt(p, n), advice) })
}

// populate faults [p, p+n) in writable. Kernels without MADV_POPULATE_WRITE
// (EINVAL before 5.14) get a write-touch of every page instead, which charges
// the same pages but turns an out-of-memory into a fault rather than an error.
//
// It advises populateStep bytes at a time: madvise holds the process's
// mmap lock for reading throughout, and an mprotect (another Commit's first
// step) needs it for writing, so one call over a large range would make
// every concurrent Commit wait for the whole of it. Between steps the writer
// gets in, and then both populate at once.
func populate(p unsafe.Pointer, n uintptr) error {
	for n > 0 {
		w := min(n, populateStep)
		err := madvise(p, w, madvPopulateWrite)
		if errors.Is(err, unix.EINVAL) && !populateSupported() {
			touch(p, n)
			return nil
		}
		if err != nil {
			return err
		}
		p, n = unsafe.Add(p, w), n-w
	}
	return nil
}

// populateStep is how much one MADV_POPULATE_WRITE call faults in.
const populateStep = 2 << 20

// touch writes a zero into the first byte of every page, which faults it in
// without changing its contents (fresh anonymous pages are zero).
func touch(p unsafe.Pointer, n uintptr) {
	ps := uintptr(pageSize)
	for off := uintptr(0); off < n; off += ps {
		b := (*byte)(unsafe.Add(p, off))
		v := *b
		*b = v
	}
}

// populateSupported reports whether the kernel knows MADV_POPULATE_WRITE,
// probing once on a private page.
var populateSupported = sync.OnceValue(func() bool {
	p, err := mmapAnon(uintptr(pageSize), unix.PROT_READ|unix.PROT_WRITE, 0)
	if err != nil {
		return false
	}
	defer munmap(p, uintptr(pageSize))
	return madvise(p, uintptr(pageSize), madvPopulateWrite) == nil
})

func fallocate(fd int, mode uint32, off, n int64) error {
	return retry(func() error { return unix.Fallocate(fd, mode, off, n) })
}

// pwriteAll writes all of b at off of fd.
func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return unix.EIO
		}
		b = b[n:]
		off += int64(n)
	}
	return nil
}

// mincore reports how many bytes of [p, p+n) are resident, as the kernel
// sees them. x/sys has no Mincore on Linux, so this calls SYS_MINCORE. For a
// shared file mapping the kernel reports the file's pages, not what this
// mapping faulted.
//
// It asks the kernel in windows of mincoreWindow pages through one fixed
// vector, so it allocates nothing whatever n is.
func mincore(p unsafe.Pointer, n uintptr) (uint64, error) {
	ps := uintptr(pageSize)
	var vec [mincoreWindow]byte
	var resident uint64
	for n > 0 {
		w := min(n, mincoreWindow*ps)
		pages := (w + ps - 1) / ps
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(p), w, uintptr(unsafe.Pointer(&vec[0])))
		if errno != 0 {
			return 0, errno
		}
		for _, v := range vec[:pages] {
			if v&1 != 0 {
				resident += uint64(ps)
			}
		}
		p, n = unsafe.Add(p, w), n-w
	}
	return resident, nil
}

// mincoreWindow is how many pages one mincore call reports on.
const mincoreWindow = 4096

// fileBytes reports the bytes the kernel has allocated to fd (st_blocks is
// in 512-byte units whatever the file system's block size).
func fileBytes(fd int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	return uint64(st.Blocks) * 512, nil
}

func retry(f func() error) error {
	for {
		err := f()
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
