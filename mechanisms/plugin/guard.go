package plugin

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// guardBuf is n bytes at the end of a private read-write mapping whose next
// page, and the page before it, are inaccessible (Options.GuardPages): a
// slot writing or reading past the buffer faults at once, naming itself,
// instead of corrupting the host's memory.
type guardBuf struct {
	mem    []byte
	off, n int
}

func newGuardBuf(n int) (*guardBuf, error) {
	pg := unix.Getpagesize()
	rw := max(pg, (n+pg-1)/pg*pg)
	mem, err := unix.Mmap(-1, 0, rw+2*pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	if err := unix.Mprotect(mem[:pg], unix.PROT_NONE); err != nil {
		_ = unix.Munmap(mem)
		return nil, err
	}
	if err := unix.Mprotect(mem[pg+rw:], unix.PROT_NONE); err != nil {
		_ = unix.Munmap(mem)
		return nil, err
	}
	return &guardBuf{mem: mem, off: pg + rw - n, n: n}, nil
}

// bytes is the buffer.
func (g *guardBuf) bytes() []byte { return g.mem[g.off : g.off+g.n] }

// ptr is the buffer's address (for an empty buffer, the guard page's).
func (g *guardBuf) ptr() unsafe.Pointer { return unsafe.Pointer(&g.mem[g.off]) }

func (g *guardBuf) free() { _ = unix.Munmap(g.mem) }

// noBack is guarded's back when there is nothing to copy back.
var noBack = func() {}

// guarded is where a slot writes the n-byte output at p: p itself, or with
// Options.GuardPages a copy of it (prefilled ids included) in a guarded
// buffer. back copies the output back to p and releases the copy; it must
// be called once the slot returned. When the guard cannot be mapped, p is
// used unguarded: the call works, only unchecked.
func (m *Mechanism) guarded(p unsafe.Pointer, n uintptr) (unsafe.Pointer, func()) {
	if !m.guard {
		return p, noBack
	}
	g, err := newGuardBuf(int(n))
	if err != nil {
		m.log.Warn("memgen plugin: no guard page", "plugin", string(m.info.Mechanism), "err", err)
		return p, noBack
	}
	out := unsafe.Slice((*byte)(p), n)
	copy(g.bytes(), out)
	return g.ptr(), func() {
		copy(out, g.bytes())
		g.free()
	}
}
