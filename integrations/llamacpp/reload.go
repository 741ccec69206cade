package llamacpp

/*
#include <stdint.h>
static inline void *memgen_llama_ptr(uintptr_t addr) { return (void *)addr; }
*/
import "C"

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
)

// A level-2 sleep discards the weights and Wake reloads them from the
// model file (the GGUF), each tensor's bytes read at its offset in the file
// straight into its place in the region. That is right only for a tensor
// whose bytes in memory are the file's: the first level-2 sleep compares
// every tensor with the file (weightBuffer.check), and a region holding
// one that differs (llama.cpp converted or repacked it at load, or it is
// not in the file) moves to the host tier as at level 1 instead. The file
// itself must be the one loaded: its size, modification time, device and
// inode are recorded at LoadModel and compared before each level-2 sleep
// and each wake (a *ModelFileError when they differ).

// ErrModelFile: the model file is not the one the weights were loaded from
// (its size, modification time or identity changed), or it cannot be
// opened or read. A level-2 sleep, which relies on reloading from it,
// refuses; a Wake fails and the model stays asleep.
var ErrModelFile = errors.New("llamacpp: the model file changed or cannot be read")

// ModelFileError says why the model file cannot give back the weights'
// bytes. It matches ErrModelFile, and the underlying error when there is
// one.
type ModelFileError struct {
	Op     string // the call that needed it: llamacpp.Model.SleepLevel or llamacpp.Model.Wake
	Path   string // the model file
	Detail string // what differs, or which read failed
	Err    error  // the os error, if any
}

func (e *ModelFileError) Error() string {
	s := fmt.Sprintf("model file %s: %s", e.Path, e.Detail)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap reports ErrModelFile and the underlying error.
func (e *ModelFileError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrModelFile, e.Err}
	}
	return []error{ErrModelFile}
}

// fileStamp identifies a version of the model file.
type fileStamp struct {
	size     int64
	mtime    time.Time
	dev, ino uint64
}

func stampOf(fi os.FileInfo) fileStamp {
	s := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.dev, s.ino = uint64(st.Dev), st.Ino
	}
	return s
}

// differs says how b differs from a ("" when it does not).
func (a fileStamp) differs(b fileStamp) string {
	switch {
	case a.size != b.size:
		return fmt.Sprintf("its size changed from %d to %d bytes since the model was loaded", a.size, b.size)
	case !a.mtime.Equal(b.mtime):
		return fmt.Sprintf("its modification time changed from %s to %s since the model was loaded", a.mtime.Format(time.RFC3339Nano), b.mtime.Format(time.RFC3339Nano))
	case a.dev != b.dev || a.ino != b.ino:
		return "it was replaced by another file since the model was loaded"
	}
	return ""
}

// stampFile records the model file's identity at load.
func (m *Model) stampFile() {
	if abs, err := filepath.Abs(m.path); err == nil {
		m.file = abs
	} else {
		m.file = m.path
	}
	if fi, err := os.Stat(m.file); err == nil {
		m.stamp = stampOf(fi)
		m.stamped = true
	}
}

// openFile opens the model file for a level-2 sleep or a wake, refusing
// one that is not the file loaded.
func (m *Model) openFile(op string) (*os.File, error) {
	if !m.stamped {
		return nil, &ModelFileError{Op: op, Path: m.file, Detail: "it could not be examined when the model was loaded"}
	}
	f, err := os.Open(m.file)
	if err != nil {
		return nil, &ModelFileError{Op: op, Path: m.file, Detail: "cannot open", Err: err}
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, errors.Join(&ModelFileError{Op: op, Path: m.file, Detail: "cannot stat", Err: err}, f.Close())
	}
	if d := m.stamp.differs(stampOf(fi)); d != "" {
		return nil, errors.Join(&ModelFileError{Op: op, Path: m.file, Detail: d}, f.Close())
	}
	return f, nil
}

// weightTensor is one tensor llama.cpp placed in a weight buffer: where it
// is in the region, and where its bytes are in the model file.
type weightTensor struct {
	name string
	off  memapi.Bytes // from the region's start
	size memapi.Bytes
	file int64 // its bytes' offset in the model file; -1: not in it
}

// fileRun is a run of tensors that lie back to back both in the region
// and in the model file: Wake reads it with one ReadAt.
type fileRun struct {
	off  memapi.Bytes
	file int64
	n    memapi.Bytes
	name string // its first tensor
}

// addTensor records a tensor llama.cpp placed in the buffer (at load, in
// init_tensor: before its bytes are read).
func (w *weightBuffer) addTensor(name string, addr memapi.DeviceAddr, size memapi.Bytes) {
	t := weightTensor{name: name, off: memapi.Bytes(addr - w.base()), size: size, file: -1}
	if ti, ok := w.m.info.Tensor(name); ok {
		at := w.m.info.Data + int64(ti.Offset)
		if at >= 0 && at+int64(size) >= at && at+int64(size) <= w.m.info.Size {
			t.file = at
		}
	}
	w.tensors = append(w.tensors, t)
}

// mem is n bytes of committed memory at addr (a region's: host memory on
// the CPU mechanism, which is what this package runs on).
func mem(addr memapi.DeviceAddr, n memapi.Bytes) []byte {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(C.memgen_llama_ptr(C.uintptr_t(addr))), int(n))
}

// checkChunk is what check reads of the file at a time.
const checkChunk = 1 << 20

// check compares, once (the buffer's first level-2 sleep), every tensor of
// the buffer with its bytes in the model file, and plans the reads that
// reload them: w.differs names the first tensor whose bytes are not the
// file's ("" when all are). A read that fails is a *ModelFileError, and
// an end of ctx its error; either way nothing is recorded, and the next
// level-2 sleep checks again.
func (w *weightBuffer) check(ctx context.Context, op string, f *os.File) error {
	if w.checked {
		return nil
	}
	ts := slices.Clone(w.tensors)
	slices.SortFunc(ts, func(a, b weightTensor) int { return cmpBytes(a.off, b.off) })
	differs := ""
	buf := make([]byte, checkChunk)
	for _, t := range ts {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s: comparing the weights with the model file: %w", op, context.Cause(ctx))
		}
		if t.file < 0 {
			differs = fmt.Sprintf("%s (not in the model file, or beyond its end)", t.name)
			break
		}
		have := mem(w.reg.Addr()+memapi.DeviceAddr(t.off), t.size)
		for at := memapi.Bytes(0); at < t.size && differs == ""; at += checkChunk {
			n := min(checkChunk, t.size-at)
			if _, err := f.ReadAt(buf[:n], t.file+int64(at)); err != nil {
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				return &ModelFileError{Op: op, Path: w.m.file, Detail: fmt.Sprintf("reading tensor %s at %d to compare it", t.name, t.file+int64(at)), Err: err}
			}
			if !bytes.Equal(buf[:n], have[at:at+n]) {
				differs = fmt.Sprintf("%s (its bytes in memory are not the model file's: llama.cpp converted it at load, or it was written since)", t.name)
			}
		}
		if differs != "" {
			break
		}
	}
	var runs []fileRun
	for _, t := range ts {
		if n := len(runs); n > 0 && runs[n-1].off+runs[n-1].n == t.off && runs[n-1].file+int64(runs[n-1].n) == t.file {
			runs[n-1].n += t.size
			continue
		}
		runs = append(runs, fileRun{off: t.off, file: t.file, n: t.size, name: t.name})
	}
	w.m.mu.Lock() // SleepState reads differs
	w.checked, w.differs, w.runs = true, differs, runs
	w.m.mu.Unlock()
	return nil
}

func cmpBytes(a, b memapi.Bytes) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// level2Fault, when set (tests only), is asked before each step of a
// level-2 sleep or wake that changes the engine and can fail: each
// decommit of a weight region or of a finished sequence's KV, and each
// read of the model file, as memapi.Op{Layer: "llamacpp", Name: step}. An
// error it returns fails that step as the step's own failure would. (The
// commits' reservations fail through the governor's Injector, which can be
// the same injector.)
var level2Fault memapi.Injector

func faultAt(step string) error {
	if level2Fault != nil {
		return level2Fault.MaybeError(memapi.Op{Layer: "llamacpp", Name: step})
	}
	return nil
}

// discard decommits the buffer's region whole, nothing copied: its bytes
// are the model file's (check).
func (w *weightBuffer) discard(ctx context.Context) error {
	if err := faultAt("decommit weights " + w.name()); err != nil {
		return err
	}
	return w.reg.Decommit(ctx, memapi.Range{Len: w.size})
}

// name names the buffer by its first tensor.
func (w *weightBuffer) name() string {
	if len(w.tensors) == 0 {
		return fmt.Sprintf("region %#x", w.reg.Addr())
	}
	return fmt.Sprintf("region %#x (%s...)", w.reg.Addr(), w.tensors[0].name)
}

// wakeChunk is how much of a region reload commits at a time. The chunks
// are committed one after another while readers (one per P, up to
// wakeReaders) fill those already committed from the model file, so the
// kernel's zeroing of fresh pages (the commit) and the copies from the
// page cache (the reads) run at once, on every core.
// (A variable so that a test can cut small regions in several chunks.)
var wakeChunk memapi.Bytes = 8 << 20

const wakeReaders = 4

// reload commits a discarded buffer's region again at its address, a
// chunk at a time (charged to the weights' holder, with pressure, bounded
// by ctx), and reads every tensor's bytes from f straight into it as each
// chunk is committed. On a failure the reads stop, what was committed is
// decommitted again once no reader writes into it (a hole, as before) and
// the error returned.
func (m *Model) reload(ctx context.Context, op string, f *os.File, w *weightBuffer) error {
	gran := w.reg.Granularity()
	chunk := max(gran, wakeChunk/gran*gran)
	chunks := make(chan memapi.Range, 1)
	var once sync.Once
	failed := make(chan struct{}) // closed when a read failed
	readers := min(runtime.GOMAXPROCS(0), wakeReaders, int((w.size+chunk-1)/chunk))
	errs := make(chan error, readers)
	var readTime atomic.Int64
	for range readers {
		go func() {
			var err error
			for c := range chunks {
				if err == nil {
					start := time.Now()
					if err = m.readChunk(op, f, w, c); err != nil {
						once.Do(func() { close(failed) })
					}
					readTime.Add(int64(time.Since(start)))
				}
			}
			errs <- err
		}()
	}
	readFailed := func() bool {
		select {
		case <-failed:
			return true
		default:
			return false
		}
	}
	var committed memapi.Bytes
	var err error
	for committed < w.size && err == nil && !readFailed() {
		rng := memapi.Range{Off: committed, Len: min(chunk, w.size-committed)}
		start := time.Now()
		if err = w.reg.Commit(ctx, rng); err == nil {
			m.wakeCommit += time.Since(start)
			committed += rng.Len
			chunks <- rng
		}
	}
	close(chunks)
	for range readers {
		err = errors.Join(err, <-errs)
	}
	m.wakeRead += time.Duration(readTime.Load())
	if err != nil && committed != 0 {
		err = errors.Join(err, w.reg.Decommit(context.WithoutCancel(ctx), memapi.Range{Len: committed}))
	}
	return err
}

// readChunk reads the parts of w's runs that lie in chunk c of its region
// (committed) from f.
func (m *Model) readChunk(op string, f *os.File, w *weightBuffer, c memapi.Range) error {
	end := c.Off + c.Len
	i, _ := slices.BinarySearchFunc(w.runs, c.Off, func(r fileRun, off memapi.Bytes) int { return cmpBytes(r.off+r.n, off+1) })
	for _, r := range w.runs[i:] {
		if r.off >= end {
			break
		}
		lo, hi := max(r.off, c.Off), min(r.off+r.n, end)
		var err error
		if lo == r.off {
			err = faultAt("read " + r.name) // one step a run
		}
		if err == nil {
			_, err = f.ReadAt(mem(w.reg.Addr()+memapi.DeviceAddr(lo), hi-lo), r.file+int64(lo-r.off))
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
		}
		if err != nil {
			return &ModelFileError{Op: op, Path: m.file, Detail: fmt.Sprintf("reading %d bytes from %d (tensor %s...)", hi-lo, r.file+int64(lo-r.off), r.name), Err: err}
		}
	}
	return nil
}
