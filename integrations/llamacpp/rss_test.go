package llamacpp

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// span is a range of addresses [addr, addr+size).
type span struct{ addr, size uintptr }

// spans are the address ranges of the model's weight buffers.
func (m *Model) spans() []span {
	var out []span
	for _, b := range m.bufs {
		out = append(out, span{uintptr(b.base()), uintptr(b.size)})
	}
	return out
}

// spans are the address ranges of the context's memory in pmm: its KV
// tensors' regions and buffers' reservations (all of them, committed or
// not: mincore counts what is resident), its compute and output buffers.
func (c *Context) spans() []span {
	var out []span
	for _, t := range c.tensors {
		out = append(out, span{uintptr(t.region.Addr()), uintptr(t.region.Cap())})
	}
	for _, b := range c.bufs {
		out = append(out, span{uintptr(b.reserve.Addr()), uintptr(b.reserve.Cap())})
	}
	for _, h := range c.host {
		out = append(out, span{uintptr(h.buf.Addr()), uintptr(h.buf.Size())})
	}
	return out
}

// rssParts is a process's resident set split by what maps it, read from
// /proc/self/smaps (each mapping's Rss, file-backed ones by file) and, for
// an anonymous mapping only partly inside a known range, mincore of that
// part. The parts add up to the resident set.
type rssParts struct {
	Exe       int64 // the executable's pages (file-backed, and its data)
	LlamaLibs int64 // llama.cpp's libraries' pages (libllama, libggml*)
	SysLibs   int64 // the other libraries' pages (libc, libstdc++, libm, ld.so…)
	Held      int64 // memgen's pmm ranges (weights and KV regions)
	GoHeap    int64 // the Go heap (goHeapSpan)
	Stack     int64 // the main thread's stack
	// Other is the remaining anonymous memory: glibc's malloc arenas and
	// mmapped chunks (llama.cpp's scheduler, graphs, compute and output
	// buffers, and on stock llama.cpp its weights and KV cache), thread
	// stacks, the libraries' zeroed data, the Go runtime's off-heap
	// structures.
	Other int64
}

func (p rssParts) total() int64 {
	return p.Exe + p.LlamaLibs + p.SysLibs + p.Held + p.GoHeap + p.Stack + p.Other
}

// heapArenaBytes is the Go heap's arena size and alignment on linux/amd64.
const heapArenaBytes = 64 << 20

// heapProbe is a heap object whose address locates the Go heap.
var heapProbe *[64]byte

// goHeapSpan is the address range of the Go heap, located from heap
// objects allocated at the start and at the end of the run (from, to):
// their arenas (64 MiB, aligned) and one arena either side. The heap's
// base is random and its arenas contiguous; nothing else is mapped there
// (the C heap, the libraries and memgen's mappings are in the mmap area).
func goHeapSpan(from, to uintptr) span {
	lo := min(from, to)&^(heapArenaBytes-1) - heapArenaBytes
	hi := max(from, to)&^(heapArenaBytes-1) + 2*heapArenaBytes
	return span{lo, hi - lo}
}

// heapAddr allocates a heap object and returns its address.
func heapAddr() uintptr {
	heapProbe = new([64]byte)
	return uintptr(unsafe.Pointer(heapProbe))
}

// readRSSParts splits this process's resident set. held are memgen's pmm
// ranges (none for stock llama.cpp); goHeap the Go heap arena(s).
func readRSSParts(held, goHeap []span) (rssParts, error) {
	var p rssParts
	exe, err := os.Executable()
	if err != nil {
		return p, err
	}
	if e, err := filepath.EvalSymlinks(exe); err == nil {
		exe = e
	}
	libDir := filepath.Dir(libPath)
	if d, err := filepath.EvalSymlinks(libDir); err == nil {
		libDir = d
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return p, err
	}
	defer f.Close()
	type mapping struct {
		start, end uintptr
		path       string
		inode      bool
		rss        int64
	}
	var maps []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Bytes()
		if rest, ok := bytes.CutPrefix(line, []byte("Rss:")); ok && len(maps) > 0 {
			kb, err := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte(" kB"))), 10, 64)
			if err != nil {
				return p, fmt.Errorf("smaps: %q: %w", line, err)
			}
			maps[len(maps)-1].rss = kb << 10
			continue
		}
		// A mapping's line: start-end perms offset dev inode [path].
		if len(line) == 0 || !('0' <= line[0] && line[0] <= '9' || 'a' <= line[0] && line[0] <= 'f') {
			continue
		}
		fields := strings.Fields(string(line))
		var start, end uint64
		if len(fields) < 5 {
			return p, fmt.Errorf("smaps: %q: not a mapping", line)
		}
		if _, err := fmt.Sscanf(fields[0], "%x-%x", &start, &end); err != nil {
			return p, fmt.Errorf("smaps: %q: %w", line, err)
		}
		m := mapping{start: uintptr(start), end: uintptr(end), inode: fields[4] != "0"}
		if len(fields) >= 6 {
			m.path = strings.Join(fields[5:], " ")
		}
		maps = append(maps, m)
	}
	if err := sc.Err(); err != nil {
		return p, err
	}
	// resident counts the resident pages of the part of m inside the
	// spans: all of m's when it lies in one, else by mincore.
	resident := func(m mapping, spans []span) (int64, error) {
		var n int64
		for _, s := range spans {
			lo, hi := max(m.start, s.addr), min(m.end, s.addr+s.size)
			if lo >= hi {
				continue
			}
			if lo == m.start && hi == m.end {
				return m.rss, nil
			}
			r, err := mincoreBytes(lo, hi)
			if err != nil {
				return 0, err
			}
			n += r
		}
		return n, nil
	}
	for _, m := range maps {
		switch {
		case m.inode && m.path == exe:
			p.Exe += m.rss
		case m.inode && filepath.Dir(m.path) == libDir:
			p.LlamaLibs += m.rss
		case m.inode:
			p.SysLibs += m.rss
		case m.path == "[stack]":
			p.Stack += m.rss
		default:
			h, err := resident(m, held)
			if err != nil {
				return p, err
			}
			g, err := resident(m, goHeap)
			if err != nil {
				return p, err
			}
			p.Held += h
			p.GoHeap += g
			p.Other += m.rss - h - g
		}
	}
	return p, nil
}

// mincoreBytes is the resident bytes of the pages in [lo, hi), asked of
// mincore 16 MiB at a time.
func mincoreBytes(lo, hi uintptr) (int64, error) {
	page := uintptr(os.Getpagesize())
	lo &^= page - 1
	var vec [4096]byte
	var n int64
	for lo < hi {
		l := min(hi-lo, uintptr(len(vec))*page)
		if _, _, e := syscall.Syscall(syscall.SYS_MINCORE, lo, l, uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
			return 0, fmt.Errorf("mincore %#x-%#x: %w", lo, lo+l, e)
		}
		for _, v := range vec[:(l+page-1)/page] {
			if v&1 != 0 {
				n += int64(page)
			}
		}
		lo += l
	}
	return n, nil
}

// goMemory is the Go runtime's own account of its memory (runtime/metrics).
type goMemory struct {
	Live     uint64 // heap bytes marked live by the last GC
	Goal     uint64 // the heap size the next GC aims at
	Objects  uint64 // heap bytes in objects, live or not yet swept
	Stacks   uint64 // goroutine stacks
	Metadata uint64 // GC and allocator metadata (mspan, mcache, other)
	Cycles   uint64 // completed GC cycles
}

func readGoMemory() goMemory {
	names := []string{
		"/gc/heap/live:bytes",
		"/gc/heap/goal:bytes",
		"/memory/classes/heap/objects:bytes",
		"/memory/classes/heap/stacks:bytes",
		"/memory/classes/metadata/mspan/inuse:bytes",
		"/memory/classes/metadata/mcache/inuse:bytes",
		"/memory/classes/metadata/other:bytes",
		"/gc/cycles/total:gc-cycles",
	}
	s := make([]metrics.Sample, len(names))
	for i, n := range names {
		s[i].Name = n
	}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	return goMemory{Live: v(0), Goal: v(1), Objects: v(2), Stacks: v(3), Metadata: v(4) + v(5) + v(6), Cycles: v(7)}
}

// llamaBuffers are the buffer sizes llama.cpp logs (in MiB, summed over
// the lines: one model buffer, and per context one KV, one output and one
// compute buffer).
type llamaBuffers struct {
	Model, KV, Output, Compute float64
	Contexts                   int
}

func parseLlamaBuffers(log string) llamaBuffers {
	var b llamaBuffers
	bufferLine := regexp.MustCompile(`(model|KV|output|compute) buffer size =\s*([0-9.]+) MiB`)
	for _, m := range bufferLine.FindAllStringSubmatch(log, -1) {
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			continue
		}
		switch m[1] {
		case "model":
			b.Model += v
		case "KV":
			b.KV += v
		case "output":
			b.Output += v
			b.Contexts++
		case "compute":
			b.Compute += v
		}
	}
	return b
}
