package ort

/*
#include <stdlib.h>
#include "bridge.h"
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"
)

// This file is the small value layer the conformance harness runs models
// with: every ONNX element type, scalars and empty tensors, outputs read in
// full. Sessions made with useEnv allocate through the registered Allocator.

// ONNX tensor element types (onnx.TensorProto.DataType).
const (
	elemFloat    = 1
	elemString   = 8
	elemFloat16  = 10
	elemDouble   = 11
	elemBFloat16 = 16
)

// elemSize is the size in bytes of one element of each fixed-size ONNX
// element type; absent types (string, and the sub-byte int4, uint4,
// float4e2m1, int2, uint2) have none.
var elemSize = map[int]int{
	1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8,
	14: 8, 15: 16, 16: 2, 17: 1, 18: 1, 19: 1, 20: 1, 24: 1,
}

// ONNX value kinds (ONNXType).
const onnxTypeTensor = 1

type ioInfo struct {
	name     string
	onnxType int
	elemType int
}

// tensor is a host copy of a tensor: fixed-size elements in Data
// (little-endian, row-major) or strings in Strings.
type tensor struct {
	Elem    int
	Shape   []int64
	Data    []byte
	Strings []string
}

func (t tensor) count() int {
	n := 1
	for _, d := range t.Shape {
		n *= int(d)
	}
	return n
}

type session struct {
	s       *C.OrtSession
	inputs  []ioInfo
	outputs []ioInfo
}

// cErr is the error of a bridge call: nil for a nil message, a
// *SessionError for an ONNX Runtime status (the code before the unit
// separator), the message otherwise (the bridge's own checks).
func cErr(msg *C.char) error {
	if msg == nil {
		return nil
	}
	defer C.free(unsafe.Pointer(msg))
	return parseErr(C.GoString(msg))
}

// newSession loads the model at path. With useEnv the session allocates
// through the environment's registered allocator; threads > 0 sets the
// intra-op thread count.
func newSession(path string, useEnv bool, threads int) (*session, error) {
	f := 0
	if useEnv {
		f = sessEnvAllocators
	}
	return newSessionWith(path, f, threads)
}

// Session flags of newSessionWith.
const (
	sessEnvAllocators = C.MEMGEN_ORT_ENV_ALLOCATORS // session.use_env_allocators = 1
	sessNoMemPattern  = C.MEMGEN_ORT_NO_MEM_PATTERN // memory patterns off: every run allocates
	sessParallel      = C.MEMGEN_ORT_PARALLEL       // nodes run on ONNX Runtime's inter-op threads
)

// newSessionWith is newSession with the options in flags (sess*).
func newSessionWith(path string, flags, threads int) (*session, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	s := &session{}
	if err := cErr(C.memgen_ort_session_new(cpath, C.int(flags), C.int(threads), &s.s)); err != nil {
		return nil, err
	}
	for out := range 2 {
		var n C.size_t
		if err := cErr(C.memgen_ort_session_count(s.s, C.int(out), &n)); err != nil {
			s.close()
			return nil, err
		}
		for i := range int(n) {
			var name *C.char
			var ot, et C.int
			if err := cErr(C.memgen_ort_session_io(s.s, C.int(out), C.size_t(i), &name, &ot, &et)); err != nil {
				s.close()
				return nil, err
			}
			info := ioInfo{name: C.GoString(name), onnxType: int(ot), elemType: int(et)}
			C.free(unsafe.Pointer(name))
			if out == 0 {
				s.inputs = append(s.inputs, info)
			} else {
				s.outputs = append(s.outputs, info)
			}
		}
	}
	return s, nil
}

func (s *session) close() {
	if s.s != nil {
		C.memgen_ort_session_free(s.s)
		s.s = nil
	}
}

// run feeds in (one tensor per session input, in order) and returns every
// output, which ONNX Runtime allocates with the session's allocator.
func (s *session) run(in []tensor) ([]tensor, error) {
	if len(in) != len(s.inputs) {
		return nil, fmt.Errorf("run: %d inputs for a model with %d", len(in), len(s.inputs))
	}
	var cstrs []*C.char
	defer func() {
		for _, p := range cstrs {
			C.free(unsafe.Pointer(p))
		}
	}()
	cstr := func(v string) *C.char { p := C.CString(v); cstrs = append(cstrs, p); return p }
	inNames := make([]*C.char, len(in)+1)
	inVals := make([]*C.OrtValue, len(in)+1)
	defer func() {
		for _, v := range inVals {
			C.memgen_ort_value_free(v)
		}
	}()
	for i, t := range in {
		inNames[i] = cstr(s.inputs[i].name)
		v, err := newValue(t)
		if err != nil {
			return nil, fmt.Errorf("input %s: %w", s.inputs[i].name, err)
		}
		inVals[i] = v
	}
	outNames := make([]*C.char, len(s.outputs)+1)
	outVals := make([]*C.OrtValue, len(s.outputs)+1)
	for i, o := range s.outputs {
		outNames[i] = cstr(o.name)
	}
	defer func() {
		for _, v := range outVals {
			C.memgen_ort_value_free(v)
		}
	}()
	if err := cErr(C.memgen_ort_run(s.s, nil, &inNames[0], &inVals[0], C.size_t(len(in)), &outNames[0], &outVals[0], C.size_t(len(s.outputs)))); err != nil {
		return nil, err
	}
	out := make([]tensor, len(s.outputs))
	for i := range s.outputs {
		t, err := readValue(outVals[i])
		if err != nil {
			return nil, fmt.Errorf("output %s: %w", s.outputs[i].name, err)
		}
		out[i] = t
	}
	return out, nil
}

func newValue(t tensor) (*C.OrtValue, error) {
	var strs []*C.char
	defer func() {
		for _, p := range strs {
			C.free(unsafe.Pointer(p))
		}
	}()
	if t.Elem == elemString {
		for _, v := range t.Strings {
			strs = append(strs, C.CString(v))
		}
	} else if sz, ok := elemSize[t.Elem]; !ok || sz*t.count() != len(t.Data) {
		return nil, fmt.Errorf("element type %d: %d bytes for shape %v", t.Elem, len(t.Data), t.Shape)
	}
	shape := make([]C.int64_t, len(t.Shape)+1)
	for i, d := range t.Shape {
		shape[i] = C.int64_t(d)
	}
	var data unsafe.Pointer
	if len(t.Data) > 0 {
		data = C.CBytes(t.Data)
		defer C.free(data)
	}
	var pstrs **C.char
	if len(strs) > 0 {
		pstrs = (**C.char)(C.malloc(C.size_t(len(strs)) * C.size_t(unsafe.Sizeof(uintptr(0)))))
		defer C.free(unsafe.Pointer(pstrs))
		copy(unsafe.Slice(pstrs, len(strs)), strs)
	}
	var v *C.OrtValue
	err := cErr(C.memgen_ort_tensor_new(C.int(t.Elem), &shape[0], C.size_t(len(t.Shape)), data, C.size_t(len(t.Data)), pstrs, C.size_t(len(strs)), &v))
	return v, err
}

func readValue(v *C.OrtValue) (tensor, error) {
	const maxRank = 16
	var ot, et C.int
	var shape [maxRank]C.int64_t
	var rank, count C.size_t
	var data unsafe.Pointer
	if err := cErr(C.memgen_ort_value_info(v, &ot, &et, &shape[0], maxRank, &rank, &count, &data)); err != nil {
		return tensor{}, err
	}
	if ot != onnxTypeTensor {
		return tensor{}, fmt.Errorf("output of ONNX type %d is not a tensor", int(ot))
	}
	t := tensor{Elem: int(et), Shape: make([]int64, int(rank))}
	for i := range t.Shape {
		t.Shape[i] = int64(shape[i])
	}
	if t.Elem == elemString {
		for i := range int(count) {
			var s *C.char
			var n C.size_t
			if err := cErr(C.memgen_ort_string_at(v, C.size_t(i), &s, &n)); err != nil {
				return tensor{}, err
			}
			t.Strings = append(t.Strings, C.GoStringN(s, C.int(n)))
			C.free(unsafe.Pointer(s))
		}
		return t, nil
	}
	sz, ok := elemSize[t.Elem]
	if !ok {
		return tensor{}, fmt.Errorf("output element type %d is not supported by the harness", t.Elem)
	}
	if count > 0 {
		t.Data = C.GoBytes(data, C.int(int(count)*sz))
	}
	return t, nil
}

// preparedRun is a run of a session with its inputs made once, for the
// benchmarks: run times ONNX Runtime's Run alone, and frees its outputs.
type preparedRun struct {
	s        *session
	inNames  []*C.char
	inVals   []*C.OrtValue
	outNames []*C.char
	outVals  []*C.OrtValue
}

// prepare makes the input values of in (one tensor per input) for runs of s.
func (s *session) prepare(in []tensor) (*preparedRun, error) {
	if len(in) != len(s.inputs) {
		return nil, fmt.Errorf("prepare: %d inputs for a model with %d", len(in), len(s.inputs))
	}
	p := &preparedRun{s: s, inNames: make([]*C.char, len(in)+1), inVals: make([]*C.OrtValue, len(in)+1),
		outNames: make([]*C.char, len(s.outputs)+1), outVals: make([]*C.OrtValue, len(s.outputs)+1)}
	for i, t := range in {
		p.inNames[i] = C.CString(s.inputs[i].name)
		v, err := newValue(t)
		if err != nil {
			p.close()
			return nil, fmt.Errorf("input %s: %w", s.inputs[i].name, err)
		}
		p.inVals[i] = v
	}
	for i, o := range s.outputs {
		p.outNames[i] = C.CString(o.name)
	}
	return p, nil
}

// run runs the session once and returns how long ONNX Runtime's Run took;
// the outputs are freed (after the timing).
func (p *preparedRun) run() (time.Duration, error) {
	t0 := time.Now()
	err := cErr(C.memgen_ort_run(p.s.s, nil, &p.inNames[0], &p.inVals[0], C.size_t(len(p.s.inputs)), &p.outNames[0], &p.outVals[0], C.size_t(len(p.s.outputs))))
	d := time.Since(t0)
	for i, v := range p.outVals {
		C.memgen_ort_value_free(v)
		p.outVals[i] = nil
	}
	return d, err
}

func (p *preparedRun) close() {
	for _, v := range p.inVals {
		C.memgen_ort_value_free(v)
	}
	for _, n := range append(p.inNames, p.outNames...) {
		C.free(unsafe.Pointer(n))
	}
	p.inVals, p.inNames, p.outNames = nil, nil, nil
}
