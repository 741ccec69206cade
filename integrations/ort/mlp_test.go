package ort

import (
	"encoding/binary"
	"math"
	"os"
	"testing"
)

// TestMLPSession runs the 4x512 MLP through the memgen allocator with
// ONNX Runtime's memory patterns and without them: the outputs agree run
// after run, the runs without patterns allocate through the pool every
// time, ONNX Runtime calls OrtAllocator::Reserve for the session's
// long-lived blocks (one per MatMul: its pre-packed weights; served as
// whole buffers of the binding, outside the pool), and the ledger is exact
// once each session closes.
func TestMLPSession(t *testing.T) {
	needSmall(t)
	r := newRig(t, 1<<30, Options{})
	in := []tensor{mlpInput(256, 512)}
	var want []tensor
	for _, v := range []struct {
		name  string
		flags int
	}{
		{"mlp4x512b256", sessEnvAllocators},
		{"mlp4x512b256/no-mem-pattern", sessEnvAllocators | sessNoMemPattern},
	} {
		if rec != nil {
			rec.mark(v.name)
		}
		before := r.alloc.Stats()
		s, err := newSessionWith(smallModel, v.flags, 1)
		if err != nil {
			t.Fatal(err)
		}
		if n := r.alloc.Stats().Reserves - before.Reserves; n < 4 {
			t.Errorf("%s: ONNX Runtime reserved %d blocks, want one per MatMul (4)", v.name, n)
		}
		if st := r.alloc.Stats(); st.ReservedBytes == 0 {
			t.Errorf("%s: no reserved bytes while the session is open: %+v", v.name, st)
		}
		for run := range 3 {
			before := r.alloc.Stats().Allocs
			got, err := s.run(in)
			if err != nil {
				t.Fatal(err)
			}
			if want == nil {
				want = got
			} else if err := compare(got[0], want[0]); err != nil {
				t.Errorf("%s, run %d: %v", v.name, run, err)
			}
			if n := r.alloc.Stats().Allocs - before; v.flags&sessNoMemPattern != 0 && n == 0 {
				t.Errorf("%s, run %d made no allocation through memgen", v.name, run)
			}
		}
		r.audit(t, v.name+": after the runs")
		s.close()
		r.auditZero(t, v.name+": session closed")
	}
}

var fanModel = envOr("MEMGEN_ORT_FAN_MODEL", cacheDir()+"/fan128dyn.onnx")

// fanBranches is the fan model's branch count (ort.sh: fan 128).
const fanBranches = 128

// fanBatches are the batch sizes the fan model runs with, in turn: its
// tensors are from 2 KiB to 256 KiB (small and large pool requests).
var fanBatches = []int{8, 96, 33, 256, 17, 160, 64, 1}

func needFan(t testing.TB) {
	if _, err := os.Stat(fanModel); err != nil {
		t.Fatalf("%v: run `make ort` to build it", err)
	}
}

// fanInput is a deterministic input of the fan model, [batch, 64].
func fanInput(batch int) tensor {
	t := tensor{Elem: elemFloat, Shape: []int64{int64(batch), 64}}
	for i := range batch * 64 {
		t.Data = binary.LittleEndian.AppendUint32(t.Data, math.Float32bits(float32(i%89)/89-0.5))
	}
	return t
}

// TestFanSession runs the fan model with memory patterns off and a batch
// that changes every run, through the memgen allocator and through ONNX
// Runtime's own arena, with the sequential and the parallel executor: the
// same outputs, more than fanBranches allocations through the pool every
// run, the ledger exact once the session closes.
func TestFanSession(t *testing.T) {
	t.Run("sequential", func(t *testing.T) { fanSession(t, 0) })
	// The parallel executor runs the branches on its inter-op thread pool
	// (2 threads: the caller's and one of ONNX Runtime's own), which call
	// Alloc and Free concurrently.
	t.Run("parallel", func(t *testing.T) { fanSession(t, sessParallel) })
}

func fanSession(t *testing.T, flags int) {
	needFan(t)
	r := newRig(t, 1<<30, Options{})
	if rec != nil && flags == 0 {
		rec.mark("fan128dyn/no-mem-pattern")
	}
	if rec != nil && flags != 0 {
		r.alloc.setObserve(nil) // the trace is the sequential order
	}
	mem, err := newSessionWith(fanModel, sessEnvAllocators|sessNoMemPattern|flags, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.close()
	def, err := newSessionWith(fanModel, sessNoMemPattern, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer def.close()
	for i, batch := range append(fanBatches, fanBatches...) {
		in := []tensor{fanInput(batch)}
		want, err := def.run(in)
		if err != nil {
			t.Fatal(err)
		}
		before := r.alloc.Stats().Allocs
		got, err := mem.run(in)
		if err != nil {
			t.Fatal(err)
		}
		if n := r.alloc.Stats().Allocs - before; n <= fanBranches {
			t.Errorf("run %d (batch %d) made %d allocations through memgen, want more than %d", i, batch, n, fanBranches)
		}
		if err := compare(got[0], want[0]); err != nil {
			t.Errorf("run %d (batch %d): %v", i, batch, err)
		}
	}
	r.audit(t, "after the runs")
	t.Logf("pool: %+v", r.alloc.Pool().Stats())
	mem.close()
	r.auditZero(t, "session closed")
}
