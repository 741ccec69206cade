package ort

import (
	"path/filepath"
	"testing"
)

func TestOneModelThroughMemgen(t *testing.T) {
	r := newRig(t, 1<<30, Options{})
	dir := filepath.Join(testData, "node", "test_add")
	s, err := newSession(filepath.Join(dir, "model.onnx"), true, 1)
	if err != nil {
		t.Fatal(err)
	}
	in := loadSet(t, dir, 0, "input", len(s.inputs))
	want := loadSet(t, dir, 0, "output", len(s.outputs))
	got, err := s.run(in)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if err := compare(got[i], want[i]); err != nil {
			t.Error(err)
		}
	}
	if r.alloc.Stats().Allocs == 0 {
		t.Error("no allocation went through the memgen allocator")
	}
	charged := r.audit(t, "session open")
	t.Logf("session open: %d bytes charged, stats %+v", charged, r.alloc.Stats())
	s.close()
	r.auditZero(t, "session closed")
}
