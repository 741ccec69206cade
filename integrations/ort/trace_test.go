package ort

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"sync"
)

// -record FILE writes ONNX Runtime's allocation sequence, as every rig's
// allocator sees it, to FILE (pool/testdata/ort-conformance.trace is made
// this way; see traceHeader).
var recordPath = flag.String("record", "", "write the allocation sequence the allocators see to this file")

// rec is the recorder of this run, nil without -record.
var rec *recorder

// traceHeader says what the trace is and how it was made.
const traceHeader = `# ONNX Runtime %s's allocation sequence through integrations/ort's allocator:
# the ONNX conformance models (TestConformanceModels, the memgen runs), the
# 4x512 MLP (TestMLPSession) and the fan-out model with a batch that changes
# every run, memory patterns off (TestFanSession); every request and free
# in order.
# Made by (from the repository root, after scripts/ort.sh):
#   cd integrations/ort && env $(cat ~/.cache/memgen/ort-1.30.0/env) GOWORK=off \
#     go test -count=1 -run '^(TestConformanceModels|TestMLPSession|TestFanSession)$' -record ../../pool/testdata/ort-conformance.trace .
# Lines: "m NAME" a model's session starts; "a ID SIZE" Alloc of SIZE bytes,
# block ID; "r ID SIZE" Reserve; "f ID" Free of block ID. An ID is reused
# once its block is freed (the smallest free one). Refused requests (zero
# bytes among them: ONNX Runtime gets NULL) and frees of unknown pointers
# are not recorded.
`

// recorder numbers the blocks ONNX Runtime holds and writes each request
// and free as one line.
type recorder struct {
	mu    sync.Mutex
	lines []byte
	ids   map[uint64]int // address -> block id
	free  []int          // ids free for reuse, largest first
	next  int
}

func newRecorder() *recorder { return &recorder{ids: map[uint64]int{}} }

// mark notes that a model's session starts.
func (r *recorder) mark(name string) {
	r.mu.Lock()
	r.lines = fmt.Appendf(r.lines, "m %s\n", name)
	r.mu.Unlock()
}

func (r *recorder) observe(op byte, addr, size uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if op == 'f' {
		id, ok := r.ids[addr]
		if !ok {
			return
		}
		delete(r.ids, addr)
		r.release(id)
		r.lines = fmt.Appendf(r.lines, "f %d\n", id)
		return
	}
	if addr == 0 {
		return // refused
	}
	id := r.take()
	r.ids[addr] = id
	r.lines = fmt.Appendf(r.lines, "%c %d %d\n", op, id, size)
}

// take returns the smallest free id.
func (r *recorder) take() int {
	if n := len(r.free); n > 0 {
		id := r.free[n-1]
		r.free = r.free[:n-1]
		return id
	}
	r.next++
	return r.next - 1
}

// release returns id, keeping free sorted largest first.
func (r *recorder) release(id int) {
	i := len(r.free)
	r.free = append(r.free, id)
	for i > 0 && r.free[i-1] < id {
		r.free[i] = r.free[i-1]
		i--
	}
	r.free[i] = id
}

func (r *recorder) write(path string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintf(w, traceHeader, RuntimeVersion())
	w.Write(r.lines)
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
