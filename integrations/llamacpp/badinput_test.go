package llamacpp

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/integrations/llamacpp/gguf"
)

// auditEmpty checks that nothing is charged, pending or reserved on the
// host authority but the weights of m (nil: none), the mechanism holds
// that much, and no holder but m's is left registered.
func (r *rig) auditEmpty(t testing.TB, what string, m *Model) {
	t.Helper()
	r.settle(t)
	s, _ := r.g.Authority(hostAuth)
	var weights memapi.Bytes
	if m != nil {
		weights, _ = memapi.RoundUp(m.WeightBytes(), 4<<10)
	}
	if s.Charged != weights || s.Pending != 0 || s.Reserved != 0 || !s.Balanced() || r.mech.UsedBytes() != weights {
		t.Errorf("%s: authority charged %d (weights %d), pending %d, reserved %d (balanced %v); mechanism %d", what, s.Charged, weights, s.Pending, s.Reserved, s.Balanced(), r.mech.UsedBytes())
	}
	left := map[governor.HolderID]bool{}
	for _, h := range r.g.Snapshot().Holders {
		left[h.ID] = true
	}
	if m != nil {
		delete(left, m.Holder())
	}
	delete(left, "sleep") // the host tier's holder (hostTier) is the rig's
	if len(left) > 0 {
		t.Errorf("%s: holders still registered: %v", what, left)
	}
}

// badModel writes a copy of the test model changed by edit.
func badModel(t *testing.T, edit func([]byte) []byte) string {
	t.Helper()
	b, err := os.ReadFile(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "bad.gguf")
	if err := os.WriteFile(p, edit(b), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBadModelFiles: a missing, truncated or corrupt GGUF file is a typed
// error (*gguf.FormatError of the right kind), and a well-formed file
// llama.cpp refuses is ErrModel; nothing stays charged or registered.
func TestBadModelFiles(t *testing.T) {
	r := newRig(t, 1<<30)
	for _, c := range []struct {
		name string
		path func(t *testing.T) string
		kind error
	}{
		{"missing", func(t *testing.T) string { return filepath.Join(t.TempDir(), "none.gguf") }, gguf.ErrMissing},
		{"a directory", func(t *testing.T) string { return t.TempDir() }, gguf.ErrMissing},
		{"empty", func(t *testing.T) string { return badModel(t, func(b []byte) []byte { return nil }) }, gguf.ErrTruncated},
		{"truncated header", func(t *testing.T) string { return badModel(t, func(b []byte) []byte { return b[:200] }) }, gguf.ErrTruncated},
		{"truncated data", func(t *testing.T) string { return badModel(t, func(b []byte) []byte { return b[:len(b)-4096] }) }, gguf.ErrTruncated},
		{"bad magic", func(t *testing.T) string { return badModel(t, func(b []byte) []byte { b[0] = 'X'; return b }) }, gguf.ErrCorrupt},
		{"bad version", func(t *testing.T) string {
			return badModel(t, func(b []byte) []byte { binary.LittleEndian.PutUint32(b[4:], 99); return b })
		}, gguf.ErrCorrupt},
		{"absurd tensor count", func(t *testing.T) string {
			return badModel(t, func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], 1<<40); return b })
		}, gguf.ErrCorrupt},
		{"absurd key length", func(t *testing.T) string {
			return badModel(t, func(b []byte) []byte { binary.LittleEndian.PutUint64(b[24:], 1<<50); return b })
		}, gguf.ErrCorrupt},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadModel(bg(t), c.path(t), r.options())
			var fe *gguf.FormatError
			if !errors.As(err, &fe) || !errors.Is(err, c.kind) {
				t.Fatalf("got %v, want a *gguf.FormatError of kind %v", err, c.kind)
			}
			t.Log(err)
			r.auditEmpty(t, c.name, nil)
		})
	}
	t.Run("an architecture llama.cpp does not know", func(t *testing.T) {
		kvs, ts := gguf.Tiny(gguf.Shape{Embd: 64, Layers: 1, Heads: 2, HeadsKV: 2, FF: 64, Vocab: 32, CtxTrain: 64}, 1)
		kvs[0].Value = "memgen-unknown"
		p := filepath.Join(t.TempDir(), "unknown.gguf")
		if err := gguf.WriteFile(p, kvs, ts); err != nil {
			t.Fatal(err)
		}
		_, err := LoadModel(bg(t), p, r.options())
		if !errors.Is(err, ErrModel) {
			t.Fatalf("got %v, want ErrModel", err)
		}
		// The error carries llama.cpp's own log line.
		if !strings.Contains(err.Error(), "unknown model architecture: 'memgen-unknown'") {
			t.Fatalf("got %v, want llama.cpp's line about the architecture", err)
		}
		t.Log(err)
		r.auditEmpty(t, "unknown architecture", nil)
	})
}

// TestContextBadInput: n_ctx whose KV cache can never fit the budget is an
// *OverBudgetError at open; closing twice and decoding after close are
// memapi.ErrClosed; bad tokens and a full context are typed; and after
// close nothing of the context is left.
func TestContextBadInput(t *testing.T) {
	r := newRig(t, 80<<20) // the weights (64 MiB) and 16 MiB
	m := loadModel(t, r.options())

	// 8,192 cells x 12 KiB = 96 MiB of KV: more than the authority has.
	_, err := m.NewContext(bg(t), ContextOptions{NCtx: 8192})
	var ob *OverBudgetError
	if !errors.As(err, &ob) || !errors.Is(err, memapi.ErrOverBudget) || ob.Wanted != 96<<20 || ob.Capacity != 80<<20 || ob.Weights != m.WeightBytes() {
		t.Fatalf("n_ctx over the budget: got %v, want an *OverBudgetError for 96 MiB beside the weights of 80 MiB", err)
	}
	t.Log(err)
	r.auditEmpty(t, "after the refused context", m)
	// 1,536 cells: 18 MiB of KV fits the 80 MiB alone, not beside the
	// weights: one sequence at its longest must fit with them.
	if _, err := m.NewContext(bg(t), ContextOptions{NCtx: 1536}); !errors.As(err, &ob) || ob.Wanted != 18<<20 || ob.Weights != m.WeightBytes() {
		t.Fatalf("n_ctx whose KV fits only without the weights: got %v, want an *OverBudgetError naming the weights", err)
	}
	r.auditEmpty(t, "after the context refused beside the weights", m)
	// Beyond the trained context (16,384), and far beyond it: refused
	// from the metadata, before llama.cpp allocates anything.
	var le *LimitError
	for _, n := range []int{16385, 1 << 30} {
		if _, err := m.NewContext(bg(t), ContextOptions{NCtx: n}); !errors.As(err, &le) || !errors.Is(err, memapi.ErrInvalidSize) || le.Field != "n_ctx" || le.Value != n || le.Limit != 16384 {
			t.Fatalf("n_ctx %d beyond the trained context: got %v, want a *LimitError naming n_ctx %d and 16384", n, err, n)
		}
	}
	t.Log(le)
	if _, err := m.NewContext(bg(t), ContextOptions{NCtx: 64, NoFlashAttention: true}); !errors.Is(err, memapi.ErrUnsupported) {
		t.Fatalf("a context without flash attention: got %v, want ErrUnsupported", err)
	}
	r.auditEmpty(t, "after the refused options", m)
	if _, err := m.NewContext(bg(t), ContextOptions{NCtx: 0}); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Fatalf("n_ctx 0: got %v", err)
	}

	c, err := m.NewContext(bg(t), ContextOptions{NCtx: 64})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Decode(bg(t), []int32{1, int32(m.NVocab())}); !errors.Is(err, ErrToken) {
		t.Fatalf("token out of range: got %v", err)
	}
	if _, err := c.Decode(bg(t), []int32{-1}); !errors.Is(err, ErrToken) {
		t.Fatalf("negative token: got %v", err)
	}
	if _, err := c.Decode(bg(t), nil); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Fatalf("no tokens: got %v", err)
	}
	if _, err := c.Decode(bg(t), prompt(1, 60, m.NVocab())); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Decode(bg(t), prompt(2, 5, m.NVocab())); !errors.Is(err, ErrContextFull) {
		t.Fatalf("65 tokens in 64 cells: got %v", err)
	}
	if got := c.KV().Cells; got != 60 {
		t.Fatalf("after the refused decodes: %d cells, want 60", got)
	}
	r.audit(t, "after the refused decodes", m, c)
	if err := m.Close(bg(t)); !errors.Is(err, memapi.ErrInUse) {
		t.Fatalf("closing the model under an open context: got %v", err)
	}
	if err := c.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(bg(t)); !errors.Is(err, memapi.ErrClosed) {
		t.Fatalf("second close: got %v", err)
	}
	if _, err := c.Decode(bg(t), []int32{1}); !errors.Is(err, memapi.ErrClosed) {
		t.Fatalf("decode after close: got %v", err)
	}
	if err := c.Reset(bg(t)); !errors.Is(err, memapi.ErrClosed) {
		t.Fatalf("reset after close: got %v", err)
	}
	r.auditEmpty(t, "after close", m)
	if err := m.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(bg(t)); !errors.Is(err, memapi.ErrClosed) {
		t.Fatalf("second model close: got %v", err)
	}
	if _, err := m.NewContext(bg(t), ContextOptions{NCtx: 64}); !errors.Is(err, memapi.ErrClosed) {
		t.Fatalf("context of a closed model: got %v", err)
	}
	r.auditEmpty(t, "after the model's close", nil)
}

// TestDecodeOverBudget: a decode whose growth the governor cannot serve
// fails at the caller's deadline with a *WaitError carrying the figures and
// matching context.DeadlineExceeded; the context keeps its cells and rows, the accounts stay exact,
// and once memory is free the same decode succeeds.
func TestDecodeOverBudget(t *testing.T) {
	r := newRig(t, 82<<20) // the weights (64 MiB), the compute buffers (9.5 MiB) and KV
	m := loadModel(t, r.options())
	c, err := m.NewContext(bg(t), ContextOptions{NCtx: 512})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Decode(bg(t), prompt(3, 16, m.NVocab())); err != nil {
		t.Fatal(err)
	}
	// Another holder takes all but 256 KiB; it is never asked to give back.
	if err := r.g.Register("hog", nil, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	hb, err := r.mgr.Bind("hog", "hog", r.host)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := r.g.Authority(hostAuth)
	hog, err := hb.Allocate(bg(t), s.Free-256<<10)
	if err != nil {
		t.Fatal(err)
	}
	r.extra = hog.Size()
	before := c.KV()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.Decode(ctx, prompt(4, 100, m.NVocab())) // 116 rows, 2 tiles: 1.5 MiB of KV
	took := time.Since(start)
	// The wait ended with the caller's deadline: that is the error, not
	// an over-budget refusal.
	var we *WaitError
	if !errors.As(err, &we) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, memapi.ErrOverBudget) {
		t.Fatalf("got %v, want a *WaitError matching context.DeadlineExceeded and not ErrOverBudget", err)
	}
	if we.Rows != 128 || we.Committed != before.Committed {
		t.Errorf("figures: %+v (before: %+v)", we, before)
	}
	t.Logf("refused after %v: %v", took, err)
	if after := c.KV(); after != before || len(c.Tokens()) != 16 {
		t.Fatalf("after the refusal: %+v, %d tokens; before %+v", after, len(c.Tokens()), before)
	}
	r.audit(t, "after the refusal", m, c)
	if err := hog.Close(); err != nil {
		t.Fatal(err)
	}
	r.settle(t)
	r.extra = 0
	if _, err := c.Decode(bg(t), prompt(4, 100, m.NVocab())); err != nil {
		t.Fatal(err)
	}
	r.audit(t, "after the retry", m, c)
	if err := c.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	if err := hb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.g.Unregister("hog"); err != nil {
		t.Fatal(err)
	}
}

// TestCloseWaitsForQueuedReleases: when the device context's queue is
// busy (another holder's release waits for its fence), a context's
// regions are released on the queue's goroutine, after Close's llama_free
// returned; Close waits for those refunds before it unregisters the
// holder, so it succeeds and leaves nothing.
func TestCloseWaitsForQueuedReleases(t *testing.T) {
	r := newRig(t, 1<<30)
	m := loadModel(t, r.options())
	if err := r.g.Register("busy", nil, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	hb, err := r.mgr.Bind("busy", "busy", r.host)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		c, err := m.NewContext(bg(t), ContextOptions{NCtx: 256})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Decode(bg(t), prompt(round, 40, m.NVocab())); err != nil {
			t.Fatal(err)
		}
		buf, err := hb.Allocate(bg(t), 4<<10)
		if err != nil {
			t.Fatal(err)
		}
		f := newDecodeFence()
		if err := buf.RecordUse(f); err != nil {
			t.Fatal(err)
		}
		if err := buf.Close(); err != nil { // pending until f completes
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			time.Sleep(50 * time.Millisecond)
			f.complete()
		}()
		if err := c.Close(bg(t)); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		<-done
		if n := r.charged(c.Holder()); n != 0 {
			t.Fatalf("round %d: closed context charged %d", round, n)
		}
	}
	r.settle(t)
	if err := hb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.g.Unregister("busy"); err != nil {
		t.Fatal(err)
	}
	r.auditEmpty(t, "after close", m)
}

// TestDecodeCancelledStopsTheWork: a Decode whose context ends while
// llama_decode runs stops it (llama.cpp's abort callback): the error is the
// context's, the context keeps its cells, tokens and rows as before, the
// ledger is exact, and the next Decode goes on from there with the tokens
// a decode that was never interrupted gives.
func TestDecodeCancelledStopsTheWork(t *testing.T) {
	r := newRig(t, 96<<20)
	m := loadModel(t, r.options())
	c, err := m.NewContext(bg(t), ContextOptions{NCtx: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(bg(t))
	first, err := c.Decode(bg(t), prompt(5, 16, m.NVocab()))
	if err != nil {
		t.Fatal(err)
	}
	before := c.KV()
	ctx, cancel := context.WithCancel(context.Background())
	set := make(chan struct{})
	abortSet = func() { close(set) }
	beforeLlamaDecode = func() {
		beforeLlamaDecode = nil
		cancel()
		<-set // the flag is up before llama_decode starts: it aborts at its first node
	}
	defer func() { abortSet, beforeLlamaDecode = nil, nil }()
	_, err = c.Decode(ctx, prompt(6, 100, m.NVocab()))
	if !errors.Is(err, context.Canceled) || errors.Is(err, memapi.ErrOverBudget) {
		t.Fatalf("a Decode cancelled while llama_decode runs: %v, want context.Canceled", err)
	}
	if after := c.KV(); after != before || len(c.Tokens()) != 16 || c.Stats().Tokens != 16 {
		t.Fatalf("after the cancelled decode: %+v, %d tokens (%d decoded); before %+v", after, len(c.Tokens()), c.Stats().Tokens, before)
	}
	r.audit(t, "after the cancelled decode", m, c)
	// The same two decodes on a fresh context, never interrupted.
	abortSet, beforeLlamaDecode = nil, nil
	want, err := c.Decode(bg(t), prompt(6, 100, m.NVocab()))
	if err != nil {
		t.Fatal(err)
	}
	c2, err := m.NewContext(bg(t), ContextOptions{NCtx: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(bg(t))
	if got, err := c2.Decode(bg(t), prompt(5, 16, m.NVocab())); err != nil || got != first {
		t.Fatalf("fresh context, first decode: %d, %v; want %d", got, err, first)
	}
	if got, err := c2.Decode(bg(t), prompt(6, 100, m.NVocab())); err != nil || got != want {
		t.Fatalf("after the cancelled decode the next one gave %d, an uninterrupted one %d (%v)", want, got, err)
	}
}
