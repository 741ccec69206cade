package llamacpp

import (
	"fmt"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cpu"
)

// kvShape is what a model's KV layout commits per token: ranges of rows
// per sequence (layers × {K, V}), each row rowBytes (F16).
type kvShape struct {
	name     string
	layers   int
	rowBytes memapi.Bytes // one token's K (or V) of one layer: KV heads × head size × 2
}

// committedFor is what one sequence of tokens tokens commits: every
// (layer, K or V) range rounded up to the granule.
func (s kvShape) committedFor(tokens int, gran memapi.Bytes) memapi.Bytes {
	per, _ := memapi.RoundUp(memapi.Bytes(tokens)*s.rowBytes, gran)
	return per * memapi.Bytes(2*s.layers)
}

func (s kvShape) live(tokens int) memapi.Bytes {
	return memapi.Bytes(tokens) * s.rowBytes * memapi.Bytes(2*s.layers)
}

// waste is the layout's committed bytes beyond the live tokens', as a
// fraction of the live KV: at exactly tokens tokens, and averaged over the
// lengths tokens-g+1 ... tokens, g the rows of a granule (a sequence's
// length is anywhere in its last granule: this is the expected waste).
func (s kvShape) waste(tokens int, gran memapi.Bytes) (at, mean float64) {
	at = float64(s.committedFor(tokens, gran)-s.live(tokens)) / float64(s.live(tokens))
	g := max(1, int(gran/s.rowBytes))
	var c, l memapi.Bytes
	for n := max(1, tokens-g+1); n <= tokens; n++ {
		c += s.committedFor(n, gran)
		l += s.live(n)
	}
	return at, float64(c-l) / float64(l)
}

var (
	// The tiny model: 6 layers, 8 KV heads of 64.
	tinyKV = kvShape{name: "tiny (6 layers, 8 KV heads x 64)", layers: 6, rowBytes: 8 * 64 * 2}
	// A 32-layer shape: 8 KV heads of 128 (Llama-3-8B's).
	kv32 = kvShape{name: "32 layers, 8 KV heads x 128", layers: 32, rowBytes: 8 * 128 * 2}
)

// TestWasteTable: what the layout of one KV stream per sequence, each
// (layer, sequence) range committed to its rows rounded up to the granule,
// commits beyond the live tokens, for the tiny model and a 32-layer shape
// at 4 KiB (the CPU) and 2 MiB (CUDA's VMM granule) granules, at 512, 4,096
// and 32,768 tokens; the tiny model's rows are measured on the real engine
// (two sequences of a context at 512 and 4,096 tokens, on the CPU
// mechanism at each granule) and must equal the computed figure. The
// expected waste at 32,768 tokens on the 32-layer shape must be under 2 %,
// at 4,096 under 15 %.
func TestWasteTable(t *testing.T) {
	var b strings.Builder
	fmt.Fprintf(&b, "\n| shape | granule | tokens | live KV | committed | waste at that length | expected waste (lengths in its last granule) |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, s := range []kvShape{tinyKV, kv32} {
		for _, g := range []memapi.Bytes{cpu.Granularity4KiB, cpu.Granularity2MiB} {
			for _, n := range []int{512, 4096, 32768} {
				at, mean := s.waste(n, g)
				fmt.Fprintf(&b, "| %s | %s | %d | %.1f MiB | %.1f MiB | %.1f %% | %.1f %% |\n", s.name, human(g), n,
					float64(s.live(n))/(1<<20), float64(s.committedFor(n, g))/(1<<20), 100*at, 100*mean)
				if s == kv32 && g == cpu.Granularity2MiB && (n == 4096 && mean > 0.15 || n == 32768 && mean > 0.02) {
					t.Errorf("%s at %s, %d tokens: expected waste %.1f %%", s.name, human(g), n, 100*mean)
				}
			}
		}
	}
	t.Log(b.String())
	for _, g := range []memapi.Bytes{cpu.Granularity4KiB, cpu.Granularity2MiB} {
		r := newRigGranule(t, 1<<30, g)
		m := loadModel(t, r.options())
		for _, n := range []int{512, 4096} {
			c, err := m.NewContext(bg(t), ContextOptions{NCtx: 4096, Sequences: 2})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: 0, Tokens: prompt(1, n, m.NVocab())}, {Seq: 1, Tokens: prompt(2, n, m.NVocab())}}); err != nil {
				t.Fatal(err)
			}
			kv := c.KV()
			if want := 2 * tinyKV.committedFor(n, g); kv.Committed != want || kv.RowBytes != 2*memapi.Bytes(tinyKV.layers)*tinyKV.rowBytes {
				t.Errorf("tiny model, %s granules, 2 sequences of %d tokens: the engine commits %d bytes (rows of %d), the table says %d", human(g), n, kv.Committed, kv.RowBytes, want)
			}
			if err := c.Close(bg(t)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// human is a granule's size in KiB or MiB.
func human(g memapi.Bytes) string {
	if g >= 1<<20 {
		return fmt.Sprintf("%d MiB", g>>20)
	}
	return fmt.Sprintf("%d KiB", g>>10)
}
