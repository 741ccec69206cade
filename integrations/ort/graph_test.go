package ort

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/memgen/memgen/generated/memapi"
)

// rewrite returns message b with each length-delimited field num replaced
// by f of its bytes (f's k counts the field's occurrences from 0).
func rewrite(b []byte, num protowire.Number, f func(k int, v []byte) []byte) []byte {
	var out []byte
	k := 0
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		m := protowire.ConsumeFieldValue(n, typ, b[l:])
		if l < 0 || m < 0 {
			panic("a malformed test model")
		}
		if n == num && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[l:])
			out = protowire.AppendTag(out, n, protowire.BytesType)
			out = protowire.AppendBytes(out, f(k, v))
			k++
		} else {
			out = append(out, b[:l+m]...)
		}
		b = b[l+m:]
	}
	return out
}

// name is a message's field 1 (ValueInfoProto's name).
func name(b []byte) string {
	var s string
	_ = fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num == 1 && typ == protowire.BytesType {
			s = string(v)
		}
		return nil
	})
	return s
}

// lyingDecoder writes the test decoder with its past and present inputs
// and outputs declaring head size hs (the model computes 64).
func lyingDecoder(t *testing.T, hs uint64) string {
	b, err := os.ReadFile(decoderModel)
	if err != nil {
		t.Fatal(err)
	}
	dim := func(v []byte) []byte { // TensorShapeProto.Dimension: dim_value 1
		return protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), hs)
	}
	lie := func(_ int, vi []byte) []byte {
		if n := name(vi); !strings.HasPrefix(n, "past_") && !strings.HasPrefix(n, "present_") {
			return vi
		}
		return rewrite(vi, 2, func(_ int, tp []byte) []byte { // type
			return rewrite(tp, 1, func(_ int, tt []byte) []byte { // tensor_type
				return rewrite(tt, 2, func(_ int, sh []byte) []byte { // shape
					return rewrite(sh, 1, func(k int, d []byte) []byte { // dim
						if k == 3 {
							return dim(d)
						}
						return d
					})
				})
			})
		})
	}
	b = rewrite(b, 7, func(_ int, g []byte) []byte {
		return rewrite(rewrite(g, 11, lie), 12, lie) // inputs, outputs
	})
	p := filepath.Join(t.TempDir(), "lying.onnx")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// The decoder is checked against its model before any byte is committed:
// a MaxSeq beyond the rows of its rotary cache, and cache tensors declaring
// a head size smaller than the dimensions the model rotates, are refused
// with a *LimitError naming the field and both values. Before, both were
// accepted (the first failed at the step past the cache's rows).
func TestDecoderCheckedAgainstItsModel(t *testing.T) {
	h := newKVHost(t, 64<<20)
	needDecoder(t)
	var le *LimitError
	_, err := NewDecoder(decoderModel, h.bind, DecoderOptions{Mode: KVGrow, MaxSeq: decMaxSeq + 1})
	if !errors.As(err, &le) || !errors.Is(err, memapi.ErrInvalidSize) || le.Field != "MaxSeq" || le.Value != decMaxSeq+1 || le.Limit != decMaxSeq {
		t.Fatalf("MaxSeq one beyond the rotary cache: %v, want a *LimitError naming MaxSeq, %d and %d", err, decMaxSeq+1, decMaxSeq)
	}
	t.Log(err)
	_, err = NewDecoder(lyingDecoder(t, 16), h.bind, DecoderOptions{Mode: KVGrow, MaxSeq: 64})
	if !errors.As(err, &le) || le.Field != "head_size" || le.Value != 16 || le.Limit != 64 {
		t.Fatalf("cache tensors declaring head size 16 of a model rotating 64: %v, want a *LimitError naming head_size, 16 and 64", err)
	}
	t.Log(err)
	if n := h.charged(t, "after the refusals"); n != 0 {
		t.Fatalf("charged %d after the refusals", n)
	}
}
