package gguf

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
)

// Shape is a llama-architecture model's size: its head size is
// Embd/Heads. F16 writes the matrices in half precision (norms stay F32,
// as llama.cpp's converters write them); Tied leaves out output.weight, so
// that llama.cpp computes the logits with the token embeddings.
type Shape struct {
	Embd, Layers, Heads, HeadsKV, FF, Vocab, CtxTrain int
	F16, Tied                                         bool
	// Q8_0 writes the matrices quantized to Q8_0 (norms stay F32); it
	// takes precedence over F16. Embd and FF must be multiples of 32.
	Q8_0 bool
}

// TinyShape is the model the integration's tests and benchmarks run: 512
// wide, 6 layers, 8 heads of 64, a feed-forward of 1,024, 1,024 tokens
// (no tokenizer: tokens are ids), trained context 16,384; F32 weights,
// 66 MiB.
var TinyShape = Shape{Embd: 512, Layers: 6, Heads: 8, HeadsKV: 8, FF: 1024, Vocab: 1024, CtxTrain: 16384}

// LargeShape is the model the plan's accuracy is measured on at scale:
// GQAShape's kind (GQA 4:1, head size 128, F16, a real vocabulary, whose
// size sets Vocab) at 2,048 wide, 10 layers, a feed-forward of 5,632 and
// its own output matrix: about 1.1 GiB with Llama 2's 32,000 tokens.
var LargeShape = Shape{Embd: 2048, Layers: 10, Heads: 16, HeadsKV: 4, FF: 5632, CtxTrain: 16384, F16: true}

// GQAShape is the second model the integration's tests run: 8 layers of
// 4 query heads of 128 sharing one KV head (GQA 4:1), a feed-forward of
// 1,024, F16 matrices, the output tied to the token embeddings, and a real
// vocabulary (Tokenizer) whose size sets Vocab.
var GQAShape = Shape{Embd: 512, Layers: 8, Heads: 4, HeadsKV: 1, FF: 1024, CtxTrain: 16384, F16: true, Tied: true}

// Tokenizer reads the tokenizer of the GGUF file at path (llama.cpp's
// source ships vocabulary-only files, such as models/ggml-vocab-llama-spm.gguf):
// every "tokenizer." metadata entry as the file encodes it, and the
// vocabulary's size (the count of tokenizer.ggml.tokens).
func Tokenizer(path string) ([]KV, int, error) {
	in, err := Check(path)
	if err != nil {
		return nil, 0, err
	}
	var kvs []KV
	n := uint64(0)
	for _, kv := range in.Raw {
		if !strings.HasPrefix(kv.Key, "tokenizer.") {
			continue
		}
		kvs = append(kvs, kv)
		if kv.Key == "tokenizer.ggml.tokens" {
			n = kv.Value.(RawValue).ArrayLen()
		}
	}
	if n == 0 {
		return nil, 0, &FormatError{Path: path, Kind: ErrCorrupt, Detail: "no tokenizer.ggml.tokens array: not a vocabulary"}
	}
	return kvs, int(n), nil
}

// Tiny returns the metadata and tensors of a llama-architecture model of
// the given shape with random weights drawn from seed and no tokenizer
// (tokens are ids): Model without one.
func Tiny(s Shape, seed uint64) ([]KV, []Tensor) { return Model(s, seed, nil) }

// Model returns the metadata and tensors of a llama-architecture model of
// the given shape with random weights drawn from seed: each matrix uniform
// in ±3/sqrt(fan-in) (at ±1/sqrt(fan-in) greedy decoding repeats one token;
// at 3 it wanders: 242 distinct tokens in 300 steps from seed 1), norms 1.
// tokenizer, when not nil, is a vocabulary's metadata (Tokenizer; s.Vocab
// must be its size); without it the model has none. The same seed gives
// the same bytes.
func Model(s Shape, seed uint64, tokenizer []KV) ([]KV, []Tensor) {
	rng := rand.New(rand.NewPCG(seed, 0x6d656d67656e))
	headDim := s.Embd / s.Heads
	kvs := []KV{
		{"general.architecture", "llama"},
		{"general.name", fmt.Sprintf("memgen-tiny-llama-seed%d", seed)},
		{"general.alignment", uint32(alignment)},
		{"llama.context_length", uint32(s.CtxTrain)},
		{"llama.embedding_length", uint32(s.Embd)},
		{"llama.block_count", uint32(s.Layers)},
		{"llama.feed_forward_length", uint32(s.FF)},
		{"llama.attention.head_count", uint32(s.Heads)},
		{"llama.attention.head_count_kv", uint32(s.HeadsKV)},
		{"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
		{"llama.rope.dimension_count", uint32(headDim)},
		{"llama.rope.freq_base", float32(10000)},
		{"llama.vocab_size", uint32(s.Vocab)},
	}
	if tokenizer == nil {
		kvs = append(kvs, KV{"tokenizer.ggml.model", "none"})
	} else {
		kvs = append(kvs, tokenizer...)
	}
	typ := uint32(TypeF32)
	switch {
	case s.Q8_0:
		typ = TypeQ8_0
	case s.F16:
		typ = TypeF16
	}
	mat := func(name string, in, out int) Tensor {
		a := float32(3 / math.Sqrt(float64(in)))
		d := make([]float32, in*out)
		for i := range d {
			d[i] = (2*rng.Float32() - 1) * a
		}
		return Tensor{Name: name, Dims: []uint64{uint64(in), uint64(out)}, Type: typ, Data: d}
	}
	// Norms stay F32, as llama.cpp's converters write them.
	ones := func(name string, n int) Tensor {
		d := make([]float32, n)
		for i := range d {
			d[i] = 1
		}
		return Tensor{Name: name, Dims: []uint64{uint64(n)}, Data: d}
	}
	kvDim := headDim * s.HeadsKV
	ts := []Tensor{mat("token_embd.weight", s.Embd, s.Vocab)}
	for i := range s.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		ts = append(ts,
			ones(p+"attn_norm.weight", s.Embd),
			mat(p+"attn_q.weight", s.Embd, s.Embd),
			mat(p+"attn_k.weight", s.Embd, kvDim),
			mat(p+"attn_v.weight", s.Embd, kvDim),
			mat(p+"attn_output.weight", s.Embd, s.Embd),
			ones(p+"ffn_norm.weight", s.Embd),
			mat(p+"ffn_gate.weight", s.Embd, s.FF),
			mat(p+"ffn_up.weight", s.Embd, s.FF),
			mat(p+"ffn_down.weight", s.FF, s.Embd),
		)
	}
	ts = append(ts, ones("output_norm.weight", s.Embd))
	if !s.Tied {
		ts = append(ts, mat("output.weight", s.Embd, s.Vocab))
	}
	return kvs, ts
}
