package llamacpp

/*
#include <stdlib.h>
#include "bridge.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
)

// ErrNoTokenizer refuses text for a model without a tokenizer (its GGUF
// says tokenizer.ggml.model = none: tokens are ids).
var ErrNoTokenizer = errors.New("llamacpp: the model has no tokenizer")

// ErrNoChatTemplate refuses a chat for a model whose GGUF carries no chat
// template (tokenizer.chat_template), or one llama.cpp does not know.
var ErrNoChatTemplate = errors.New("llamacpp: no chat template llama.cpp can apply")

// HasTokenizer says whether the model turns text into tokens.
func (m *Model) HasTokenizer() bool {
	t := m.info.String("tokenizer.ggml.model")
	return t != "" && t != "none"
}

// Tokenize turns text into the model's tokens with llama.cpp's tokenizer
// (special tokens in the text parsed; with addSpecial, the BOS token first
// when the vocabulary asks for one). A model without a tokenizer is
// ErrNoTokenizer.
func (m *Model) Tokenize(text string, addSpecial bool) ([]int32, error) {
	if !m.HasTokenizer() {
		return nil, ErrNoTokenizer
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, memapi.Errorf("llamacpp.Model.Tokenize", memapi.ErrClosed, "model %s was closed", m.path)
	}
	ctext := C.CString(text)
	defer C.free(unsafe.Pointer(ctext))
	out := make([]C.llama_token, len(text)+2)
	n := C.memgen_llama_tokenize(m.c, ctext, C.int32_t(len(text)), &out[0], C.int32_t(len(out)), C.bool(addSpecial))
	if n < 0 {
		out = make([]C.llama_token, -n)
		n = C.memgen_llama_tokenize(m.c, ctext, C.int32_t(len(text)), &out[0], C.int32_t(len(out)), C.bool(addSpecial))
	}
	if n < 0 {
		return nil, fmt.Errorf("llamacpp: llama_tokenize returned %d", int32(n))
	}
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32(out[i])
	}
	return toks, nil
}

// Piece is token t's text (a special token renders as nothing; a piece may
// be part of a multi-byte character, completed by the next ones). A model
// without a tokenizer is ErrNoTokenizer, a token outside the vocabulary
// ErrToken.
func (m *Model) Piece(t int32) (string, error) {
	if !m.HasTokenizer() {
		return "", ErrNoTokenizer
	}
	if t < 0 || int(t) >= m.nVocab {
		return "", fmt.Errorf("%w: %d (vocabulary of %d)", ErrToken, t, m.nVocab)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var buf [64]C.char
	n := C.memgen_llama_piece(m.c, C.llama_token(t), &buf[0], C.int32_t(len(buf)))
	if n < 0 {
		big := make([]C.char, -n)
		n = C.memgen_llama_piece(m.c, C.llama_token(t), &big[0], C.int32_t(len(big)))
		return C.GoStringN(&big[0], n), nil
	}
	return C.GoStringN(&buf[0], n), nil
}

// IsEndOfGeneration says whether t ends a generation (EOS, EOT and the
// like, as the vocabulary marks them); false for a model without a
// tokenizer.
func (m *Model) IsEndOfGeneration(t int32) bool {
	if !m.HasTokenizer() || t < 0 || int(t) >= m.nVocab {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return bool(C.memgen_llama_is_eog(m.c, C.llama_token(t)))
}

// ChatMessage is one message of a chat: its role ("system", "user",
// "assistant") and text.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ApplyChatTemplate formats a chat with the model's chat template
// (llama_chat_apply_template: llama.cpp's built-in templates, which it
// recognises in the model's tokenizer.chat_template), ending with the
// assistant's turn. A model without a template, or with one llama.cpp
// does not know, is ErrNoChatTemplate.
func (m *Model) ApplyChatTemplate(msgs []ChatMessage) (string, error) {
	m.mu.Lock()
	tmpl := C.memgen_llama_chat_template(m.c)
	m.mu.Unlock()
	if tmpl == nil {
		return "", ErrNoChatTemplate
	}
	n := len(msgs)
	roles := make([]*C.char, max(n, 1))
	contents := make([]*C.char, max(n, 1))
	size := 64
	for i, msg := range msgs {
		roles[i], contents[i] = C.CString(msg.Role), C.CString(msg.Content)
		size += 2 * (len(msg.Role) + len(msg.Content) + 16)
	}
	defer func() {
		for i := range n {
			C.free(unsafe.Pointer(roles[i]))
			C.free(unsafe.Pointer(contents[i]))
		}
	}()
	croles := (**C.char)(C.calloc(C.size_t(max(n, 1)), C.size_t(unsafe.Sizeof((*C.char)(nil)))))
	ccontents := (**C.char)(C.calloc(C.size_t(max(n, 1)), C.size_t(unsafe.Sizeof((*C.char)(nil)))))
	defer C.free(unsafe.Pointer(croles))
	defer C.free(unsafe.Pointer(ccontents))
	copy(unsafe.Slice(croles, max(n, 1)), roles)
	copy(unsafe.Slice(ccontents, max(n, 1)), contents)
	for {
		buf := (*C.char)(C.malloc(C.size_t(size)))
		r := C.memgen_llama_chat_apply(tmpl, croles, ccontents, C.size_t(n), buf, C.int32_t(size))
		if r < 0 {
			C.free(unsafe.Pointer(buf))
			return "", fmt.Errorf("%w: %q", ErrNoChatTemplate, C.GoString(tmpl))
		}
		if int(r) <= size {
			s := C.GoStringN(buf, r)
			C.free(unsafe.Pointer(buf))
			return s, nil
		}
		C.free(unsafe.Pointer(buf))
		size = int(r)
	}
}

// Sampler draws a sequence's next token from its logits: llama.cpp's
// sampler chain of a temperature and a draw from a generator seeded with
// the seed, so that the same seed gives the same tokens. It keeps state
// (its generator): one sequence at a time uses it. Close frees it.
type Sampler struct {
	mu sync.Mutex
	p  *C.struct_llama_sampler
}

// NewSampler makes a sampler at temperature temp (> 0; for greedy decoding
// pass no sampler) from seed.
func NewSampler(temp float32, seed uint32) (*Sampler, error) {
	if !(temp > 0) {
		return nil, memapi.Errorf("llamacpp.NewSampler", memapi.ErrInvalidSize, "temperature %g: greedy decoding takes no sampler", temp)
	}
	p := C.memgen_llama_sampler_new(C.float(temp), C.uint32_t(seed))
	if p == nil {
		return nil, errors.New("llamacpp: llama_sampler_chain_init failed")
	}
	return &Sampler{p: p}, nil
}

// Close frees the sampler; a second Close does nothing.
func (s *Sampler) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p != nil {
		C.memgen_llama_sampler_free(s.p)
		s.p = nil
	}
}
