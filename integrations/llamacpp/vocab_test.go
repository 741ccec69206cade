package llamacpp

import (
	"errors"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// TestVocabulary: the GQA model (a real vocabulary) tokenizes text with
// llama.cpp's tokenizer and its tokens' pieces give the text back; its
// chat template formats a chat; the tiny model (tokens are ids) refuses
// text and chats with typed errors.
func TestVocabulary(t *testing.T) {
	m := loadModelAt(t, gqaModelPath, Options{Stock: true})
	toks, err := m.Tokenize("Hello world, memgen!", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(toks) < 3 || toks[0] != 1 {
		t.Fatalf("tokens %v: want the BOS (1) and the text's", toks)
	}
	var text strings.Builder
	for _, tok := range toks {
		p, err := m.Piece(tok)
		if err != nil {
			t.Fatal(err)
		}
		text.WriteString(p)
	}
	if got := strings.TrimSpace(text.String()); got != "Hello world, memgen!" {
		t.Errorf("pieces give %q", got)
	}
	if _, err := m.Piece(int32(m.NVocab())); !errors.Is(err, ErrToken) {
		t.Errorf("a token outside the vocabulary: got %v", err)
	}
	if !m.IsEndOfGeneration(2) || m.IsEndOfGeneration(toks[1]) {
		t.Errorf("end of generation: EOS (2) %v, %d %v", m.IsEndOfGeneration(2), toks[1], m.IsEndOfGeneration(toks[1]))
	}
	chat, err := m.ApplyChatTemplate([]ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi?"}})
	if err != nil || !strings.Contains(chat, "[INST]") || !strings.Contains(chat, "Hi?") || !strings.Contains(chat, "Be brief.") {
		t.Errorf("chat: %q, %v", chat, err)
	}
	t.Logf("%d tokens %v; chat %q", len(toks), toks, chat)

	tiny := loadModel(t, Options{Stock: true})
	if _, err := tiny.Tokenize("hi", true); !errors.Is(err, ErrNoTokenizer) {
		t.Errorf("tiny Tokenize: got %v", err)
	}
	if _, err := tiny.ApplyChatTemplate([]ChatMessage{{Role: "user", Content: "hi"}}); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("tiny chat: got %v", err)
	}
}

// TestSampler: a sequence decoded with a sampler draws the same tokens from
// the same seed, others from another, and not only the greedy ones; a
// closed sampler is refused (memapi.ErrClosed), and a temperature of 0 is
// not a sampler.
func TestSampler(t *testing.T) {
	m := loadModelAt(t, gqaModelPath, Options{Stock: true})
	run := func(seed uint32, greedy bool) []int32 {
		c, err := m.NewContext(bg(t), ContextOptions{NCtx: 256})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(bg(t))
		var s *Sampler
		if !greedy {
			if s, err = NewSampler(1.5, seed); err != nil {
				t.Fatal(err)
			}
			defer s.Close()
		}
		in := []SeqTokens{{Seq: 0, Tokens: prompt(3, 8, m.NVocab()), Sampler: s}}
		var out []int32
		for range 24 {
			next, err := c.DecodeBatch(bg(t), in)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, next[0])
			in[0].Tokens = next[:1]
		}
		return out
	}
	a, b, other, greedy := run(7, false), run(7, false), run(8, false), run(0, true)
	if hashTokens(a) != hashTokens(b) {
		t.Errorf("one seed, two runs:\n%v\n%v", a, b)
	}
	if hashTokens(a) == hashTokens(other) || hashTokens(a) == hashTokens(greedy) {
		t.Errorf("seeds 7 and 8 and greedy decoding gave the same tokens: %v", a)
	}
	s, err := NewSampler(1, 1)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	c, err := m.NewContext(bg(t), ContextOptions{NCtx: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(bg(t))
	if _, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: 0, Tokens: []int32{1}, Sampler: s}}); !errors.Is(err, memapi.ErrClosed) {
		t.Errorf("a closed sampler: got %v", err)
	}
	if _, err := NewSampler(0, 1); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Errorf("temperature 0: got %v", err)
	}
}
