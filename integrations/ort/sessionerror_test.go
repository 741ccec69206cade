package ort

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// ONNX Runtime's failures are typed: a *SessionError with the code, whose
// errors.Is says what kind of failure it was (a missing file, a model it
// cannot load, a wrong argument), through NewDecoder too. Before, they
// were strings.
func TestSessionErrorsAreTyped(t *testing.T) {
	needSmall(t)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.onnx")
	if err := os.WriteFile(garbage, []byte("not a protobuf at all \xff\xfe"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path string
		code       ErrCode
		is         error
	}{
		{"missing file", filepath.Join(dir, "none.onnx"), CodeNoSuchFile, fs.ErrNotExist},
		{"garbage", garbage, CodeInvalidProtobuf, ErrBadModel},
	} {
		_, err := newSession(c.path, false, 1)
		var se *SessionError
		if !errors.As(err, &se) || se.Code != c.code || !errors.Is(err, c.is) {
			t.Errorf("%s: %v, want a *SessionError %v matching %v", c.name, err, c.code, c.is)
		}
	}
	// Through NewDecoder: the same errors, nothing charged.
	h := newKVHost(t, 64<<20)
	if _, err := NewDecoder(garbage, h.bind, DecoderOptions{Mode: KVGrow, MaxSeq: 16}); !errors.Is(err, ErrBadModel) {
		t.Errorf("NewDecoder of a garbage file: %v, want ErrBadModel", err)
	}
	if _, err := NewDecoder(filepath.Join(dir, "none.onnx"), h.bind, DecoderOptions{Mode: KVGrow, MaxSeq: 16}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("NewDecoder of a missing file: %v, want fs.ErrNotExist", err)
	}
	if n := h.charged(t, "after the refused decoders"); n != 0 {
		t.Errorf("charged %d after the refused decoders", n)
	}
	s, err := newSession(smallModel, false, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	// A float input of the wrong shape: ONNX Runtime's invalid argument.
	in := make([]tensor, len(s.inputs))
	for i := range in {
		in[i] = tensor{Elem: elemFloat, Shape: []int64{1, 3}, Data: make([]byte, 12)}
	}
	_, err = s.run(in)
	var se *SessionError
	if !errors.As(err, &se) || se.Code != CodeInvalidArgument || !errors.Is(err, memapi.ErrInvalidRange) {
		t.Errorf("a run with the wrong shape: %v, want a *SessionError ORT_INVALID_ARGUMENT matching memapi.ErrInvalidRange", err)
	}
	t.Log(err)
}
