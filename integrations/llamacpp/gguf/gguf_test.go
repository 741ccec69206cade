package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
)

var small = Shape{Embd: 64, Layers: 2, Heads: 4, HeadsKV: 2, FF: 96, Vocab: 40, CtxTrain: 128}

func writeSmall(t *testing.T, seed uint64) (string, []byte) {
	t.Helper()
	kvs, ts := Tiny(small, seed)
	p := filepath.Join(t.TempDir(), "m.gguf")
	if err := WriteFile(p, kvs, ts); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, b
}

// TestWriteThenCheck: what Write writes, Check reads back: the metadata,
// every tensor's dimensions, type and aligned offset, and the file's size
// is the data section's end.
func TestWriteThenCheck(t *testing.T) {
	p, b := writeSmall(t, 1)
	in, err := Check(p)
	if err != nil {
		t.Fatal(err)
	}
	if in.String("general.architecture") != "llama" || in.String("tokenizer.ggml.model") != "none" {
		t.Errorf("metadata: %v", in.Meta)
	}
	if n, ok := in.Uint("llama.embedding_length"); !ok || n != 64 {
		t.Errorf("llama.embedding_length = %d, %v", n, ok)
	}
	_, ts := Tiny(small, 1)
	if len(in.Tensors) != len(ts) {
		t.Fatalf("%d tensors, want %d", len(in.Tensors), len(ts))
	}
	var end uint64
	for i, ti := range in.Tensors {
		if ti.Name != ts[i].Name || ti.Type != TypeF32 || len(ti.Dims) != len(ts[i].Dims) || ti.Offset%alignment != 0 {
			t.Errorf("tensor %d: %+v, want %s %v", i, ti, ts[i].Name, ts[i].Dims)
		}
		end = ti.Offset + pad(4*uint64(len(ts[i].Data)), alignment)
	}
	if data := uint64(len(b)) - end; data%alignment != 0 || int64(data) != in.Data {
		t.Errorf("the data section starts at %d (Check says %d), not aligned", data, in.Data)
	}
	// Each tensor's bytes are at Data + Offset.
	for i, ti := range in.Tensors {
		at := uint64(in.Data) + ti.Offset
		if got := math.Float32frombits(binary.LittleEndian.Uint32(b[at:])); got != ts[i].Data[0] {
			t.Errorf("tensor %s's first value at %d: %v, want %v", ti.Name, at, got, ts[i].Data[0])
		}
	}
	emb, _ := in.Tensor("token_embd.weight")
	if emb.Dims[0] != 64 || emb.Dims[1] != 40 {
		t.Errorf("token_embd.weight %v", emb.Dims)
	}
}

// TestTinyIsDeterministic: the same seed gives the same bytes, another
// seed other weights.
func TestTinyIsDeterministic(t *testing.T) {
	_, a := writeSmall(t, 7)
	_, b := writeSmall(t, 7)
	_, c := writeSmall(t, 8)
	if !bytes.Equal(a, b) {
		t.Error("seed 7 wrote two different files")
	}
	if bytes.Equal(a[len(a)-4096:], c[len(c)-4096:]) {
		t.Error("seeds 7 and 8 wrote the same weights")
	}
}

// TestCheckRejects: every way a file can be wrong is a *FormatError of
// its kind.
func TestCheckRejects(t *testing.T) {
	_, good := writeSmall(t, 1)
	for _, c := range []struct {
		name string
		edit func([]byte) []byte
		kind error
	}{
		{"empty", func(b []byte) []byte { return nil }, ErrTruncated},
		{"header cut", func(b []byte) []byte { return b[:20] }, ErrTruncated},
		{"metadata cut", func(b []byte) []byte { return b[:100] }, ErrTruncated},
		{"data cut", func(b []byte) []byte { return b[:len(b)-100] }, ErrTruncated},
		{"magic", func(b []byte) []byte { b[3] = 'X'; return b }, ErrCorrupt},
		{"version", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[4:], 7); return b }, ErrCorrupt},
		{"tensor count", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], 1<<30); return b }, ErrCorrupt},
		{"metadata count", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[16:], 1<<30); return b }, ErrCorrupt},
		{"key length", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[24:], 1<<40); return b }, ErrCorrupt},
		{"value type", func(b []byte) []byte {
			// the first key is "general.architecture" (20 bytes): its type follows
			binary.LittleEndian.PutUint32(b[24+8+20:], 99)
			return b
		}, ErrCorrupt},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "bad.gguf")
			if err := os.WriteFile(p, c.edit(bytes.Clone(good)), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Check(p)
			var fe *FormatError
			if !errors.As(err, &fe) || !errors.Is(err, c.kind) {
				t.Fatalf("got %v, want a *FormatError of kind %v", err, c.kind)
			}
		})
	}
	if _, err := Check(filepath.Join(t.TempDir(), "none")); !errors.Is(err, ErrMissing) {
		t.Fatalf("missing file: got %v", err)
	}
	if _, err := Check(t.TempDir()); !errors.Is(err, ErrMissing) {
		t.Fatalf("a directory: got %v", err)
	}
}

// TestFloat16: half precision, rounded to nearest even, with its edges.
func TestFloat16(t *testing.T) {
	for _, c := range []struct {
		f    float32
		want uint16
	}{
		{0, 0}, {1, 0x3c00}, {-2, 0xc000}, {0.5, 0x3800}, {65504, 0x7bff},
		{65520, 0x7c00},                 // rounds up past the largest half: infinity
		{float32(math.Inf(-1)), 0xfc00}, // infinity stays one
		{5.960464477539063e-08, 0x0001}, // the smallest subnormal
		{2.9e-08, 0},                    // under half of it: zero
		{1.0009765625, 0x3c01},          // 1 + 2^-10: exact
		{1.00048828125, 0x3c00},         // 1 + 2^-11: a tie, to even (down)
		{1.00146484375, 0x3c02},         // 1 + 3*2^-11: a tie, to even (up)
		{6.097555160522461e-05, 0x03ff}, // the largest subnormal
	} {
		if got := Float16(c.f); got != c.want {
			t.Errorf("Float16(%g) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	if got := Float16(float32(math.NaN())); got&0x7c00 != 0x7c00 || got&0x3ff == 0 {
		t.Errorf("Float16(NaN) = %#04x, not a NaN", got)
	}
}

// rawStrings encodes an array of strings as a GGUF metadata value.
func rawStrings(ss ...string) RawValue {
	b := binary.LittleEndian.AppendUint32(nil, 8)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(ss)))
	for _, s := range ss {
		b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
	}
	return RawValue{Type: typeArray, Bytes: b}
}

// TestTokenizerCopied: a model written with a vocabulary's entries carries
// them byte for byte (Check's Raw of the model has the same values), its
// matrices are F16 (half the bytes) and a tied model has no output.weight;
// Tokenizer reads the entries back with the vocabulary's size, and refuses
// a file without tokens.
func TestTokenizerCopied(t *testing.T) {
	tok := []KV{
		{"tokenizer.ggml.model", "llama"},
		{"tokenizer.ggml.tokens", rawStrings(make([]string, 40)...)},
		{"tokenizer.ggml.bos_token_id", uint32(1)},
	}
	s := small
	s.F16, s.Tied = true, true
	kvs, ts := Model(s, 1, tok)
	p := filepath.Join(t.TempDir(), "v.gguf")
	if err := WriteFile(p, kvs, ts); err != nil {
		t.Fatal(err)
	}
	got, n, err := Tokenizer(p)
	if err != nil || n != 40 || len(got) != 3 {
		t.Fatalf("Tokenizer: %d entries, vocabulary %d, %v", len(got), n, err)
	}
	if v := got[1].Value.(RawValue); got[1].Key != "tokenizer.ggml.tokens" || !bytes.Equal(v.Bytes, tok[1].Value.(RawValue).Bytes) {
		t.Errorf("the tokens were not copied byte for byte: %s", got[1].Key)
	}
	in, err := Check(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := in.Tensor("output.weight"); ok {
		t.Error("a tied model has output.weight")
	}
	if q, ok := in.Tensor("blk.0.attn_q.weight"); !ok || q.Type != TypeF16 {
		t.Errorf("attn_q: %+v, want F16", q)
	}
	if nrm, ok := in.Tensor("blk.0.attn_norm.weight"); !ok || nrm.Type != TypeF32 {
		t.Errorf("attn_norm: %+v, want F32", nrm)
	}
	tiny, _ := writeSmall(t, 1)
	if _, _, err := Tokenizer(tiny); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a file without tokens: got %v, want ErrCorrupt", err)
	}
}

// TestQ8_0: a block is the half-precision scale max|x|/127 and each value
// x/d rounded half away from zero, as llama.cpp's quantize_row_q8_0_ref
// writes it; a Q8_0 file checks, with 34 bytes a block; a row that is not
// a whole number of blocks is refused.
func TestQ8_0(t *testing.T) {
	x := make([]float32, 32)
	for i := range x {
		x[i] = float32(i-16) / 4 // -4 .. 3.75
	}
	var blk [34]byte
	quantizeQ8(blk[:], x)
	d := float32(4) / 127
	if got := binary.LittleEndian.Uint16(blk[:2]); got != Float16(d) {
		t.Errorf("scale %#x, want %#x", got, Float16(d))
	}
	for i, v := range x {
		want := int8(math.Round(float64(v / d)))
		if got := int8(blk[2+i]); got != want {
			t.Errorf("value %d: %d, want %d", i, got, want)
		}
	}
	if int8(blk[2]) != -127 {
		t.Errorf("the largest magnitude is %d, want -127", int8(blk[2]))
	}
	var zero [34]byte
	quantizeQ8(zero[:], make([]float32, 32))
	if zero != ([34]byte{}) {
		t.Errorf("a block of zeros: %v", zero)
	}

	s := GQAShape
	s.Vocab, s.Layers, s.Q8_0 = 64, 1, true
	kvs, ts := Model(s, 1, nil)
	p := filepath.Join(t.TempDir(), "q8.gguf")
	if err := WriteFile(p, kvs, ts); err != nil {
		t.Fatal(err)
	}
	in, err := Check(p)
	if err != nil {
		t.Fatal(err)
	}
	q, ok := in.Tensor("blk.0.attn_q.weight")
	if !ok || q.Type != TypeQ8_0 {
		t.Fatalf("attn_q: %+v, want Q8_0", q)
	}
	bad := []Tensor{{Name: "odd", Dims: []uint64{48, 2}, Type: TypeQ8_0, Data: make([]float32, 96)}}
	if err := WriteFile(filepath.Join(t.TempDir(), "bad.gguf"), nil, bad); err == nil {
		t.Error("a Q8_0 row of 48 values was written")
	}
}
