package llamacpp

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
)

// weightSums is a checksum of every weight tensor's bytes in memory, by
// region and name (the model must be awake).
func weightSums(m *Model) map[string]uint32 {
	tab := crc32.MakeTable(crc32.Castagnoli)
	out := map[string]uint32{}
	for i, w := range m.bufs {
		for _, t := range w.tensors {
			out[string(rune('a'+i))+"/"+t.name] = crc32.Checksum(mem(w.reg.Addr()+memapi.DeviceAddr(t.off), t.size), tab)
		}
	}
	return out
}

// sameSums fails the test unless every tensor's checksum is as before.
func sameSums(t *testing.T, what string, got, want map[string]uint32) {
	t.Helper()
	if len(got) != len(want) || len(want) == 0 {
		t.Fatalf("%s: %d tensors, want %d", what, len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s: tensor %s's bytes changed (crc32c %08x, was %08x)", what, k, got[k], v)
		}
	}
}

// residentRegions checks with mincore that no region of the model's
// weights and of the contexts' KV caches holds more than one granule.
func residentRegions(t *testing.T, m *Model, cs ...*Context) {
	t.Helper()
	check := func(what string, addr memapi.DeviceAddr, size, gran memapi.Bytes) {
		n, err := mincoreBytes(uintptr(addr), uintptr(addr)+uintptr(size))
		if err != nil {
			t.Fatal(err)
		}
		if n > int64(gran) {
			t.Fatalf("%s at %#x: %d bytes resident (mincore), more than a granule (%d)", what, addr, n, gran)
		}
	}
	for _, w := range m.bufs {
		check("weights "+w.name(), w.reg.Addr(), w.reg.Cap(), w.reg.Granularity())
	}
	for _, c := range cs {
		for _, kt := range c.tensors {
			check(string(c.holder)+" "+kt.name, kt.region.Addr(), kt.region.Cap(), kt.region.Granularity())
		}
	}
}

// A level-2 sleep of an idle engine (its one sequence finished) discards
// the weights and the finished sequence's KV cache: nothing goes to the
// host tier, the device's ledger, the regions' pages (mincore) and the
// process's resident set drop by the weights; Wake reloads every tensor
// from the model file, byte for byte, and a new request gets the greedy
// tokens of a fresh engine.
func TestSleepLevel2Idle(t *testing.T) {
	p := prompt(11, 32, 1024)
	want := func() []int32 {
		r := newRig(t, 1<<30)
		m := loadModel(t, r.options())
		return greedyTokens(t, m, p, 24)
	}()
	r := newRig(t, 1<<30)
	tier := r.hostTier(t)
	m := loadModel(t, r.options())
	c, err := m.NewContext(bg(t), ContextOptions{NCtx: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(bg(t))
	next, err := c.Decode(bg(t), prompt(3, 40, m.NVocab()))
	if err != nil {
		t.Fatal(err)
	}
	for range 8 {
		if next, err = c.Decode(bg(t), []int32{next}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.FinishSeq(0); err != nil {
		t.Fatal(err)
	}
	if err := c.FinishSeq(1); !errors.Is(err, memapi.ErrInvalidRange) {
		t.Fatalf("FinishSeq of a sequence the context lacks: %v", err)
	}
	sums := weightSums(m)
	exactTiers(t, r, tier)
	weights, kv := r.charged(m.Holder()), c.KV().Committed
	if weights != m.WeightBytes() || kv == 0 {
		t.Fatalf("before the sleep: weights %d charged (buffers %d), KV %d", weights, m.WeightBytes(), kv)
	}
	devBefore, _ := r.g.Authority(hostAuth)
	debug.FreeOSMemory() // the Go heap's share of the resident set, as small before as after
	rssBefore, err := residentBytes()
	if err != nil {
		t.Fatal(err)
	}

	if err := m.SleepLevel(bg(t), 3, tier.bind); !errors.Is(err, ErrSleepLevel) || m.Asleep() {
		t.Fatalf("sleep level 3: %v (asleep %v)", err, m.Asleep())
	}
	if err := m.SleepLevel(bg(t), 0, tier.bind); !errors.Is(err, ErrSleepLevel) || m.Asleep() {
		t.Fatalf("sleep level 0: %v (asleep %v)", err, m.Asleep())
	}
	if err := m.Wake(bg(t)); !errors.Is(err, ErrNotAsleep) {
		t.Fatalf("a wake of an awake model: %v", err)
	}
	start := time.Now()
	// Nothing has to move: no host binding is needed.
	if err := m.SleepLevel(bg(t), 2, nil); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	exactTiers(t, r, tier)
	debug.FreeOSMemory()
	rssAfter, err := residentBytes()
	if err != nil {
		t.Fatal(err)
	}
	dev, _ := r.g.Authority(hostAuth)
	freed := devBefore.Charged - dev.Charged
	freedPercent(t, 2, freed, weights+kv)
	if r.charged(m.Holder()) != 0 || c.KV().Committed != 0 || 100*freed < 95*(weights+kv) {
		t.Fatalf("asleep: weights %d and KV %d still charged; freed %d of %d", r.charged(m.Holder()), c.KV().Committed, freed, weights+kv)
	}
	if h := r.chargedOn("sleep", offloadAuth); h != 0 {
		t.Fatalf("a level-2 sleep put %d bytes in the host tier", h)
	}
	if st := m.SleepState(); st.Level != 2 || st.Discarded != weights || st.Moved != 0 || len(st.Kept) != 0 {
		t.Fatalf("sleep state %+v, want level 2 with the %d bytes of weights discarded", st, weights)
	}
	residentRegions(t, m, c)
	dropped := rssBefore - rssAfter
	t.Logf("level 2 in %v: the device gave back %d of %d bytes (weights %d, KV %d: %.1f%%); RSS %.1f MiB before, %.1f MiB after (%.1f MiB less: %.1f%% of the weights)",
		took, freed, weights+kv, weights, kv, 100*float64(freed)/float64(weights+kv),
		float64(rssBefore)/(1<<20), float64(rssAfter)/(1<<20), float64(dropped)/(1<<20), 100*float64(dropped)/float64(weights))
	if 100*dropped < 95*int64(weights) {
		t.Fatalf("RSS dropped by %d bytes, less than 95%% of the weights' %d", dropped, weights)
	}
	if _, err := c.Decode(bg(t), []int32{next}); !errors.Is(err, ErrAsleep) {
		t.Fatalf("a decode while asleep: %v", err)
	}
	if err := m.SleepLevel(bg(t), 2, tier.bind); !errors.Is(err, ErrAsleep) {
		t.Fatalf("a second sleep: %v", err)
	}

	start = time.Now()
	if err := m.Wake(bg(t)); err != nil {
		t.Fatal(err)
	}
	t.Logf("woken in %v (commit %v, reads %v)", time.Since(start), m.wakeCommit, m.wakeRead)
	exactTiers(t, r, tier)
	if r.charged(m.Holder()) != weights || c.KV().Committed != 0 || m.SleepState().Level != 0 {
		t.Fatalf("awake: weights %d (want %d), KV %d (the finished sequence's was discarded), state %+v", r.charged(m.Holder()), weights, c.KV().Committed, m.SleepState())
	}
	sameSums(t, "after the wake", weightSums(m), sums)
	// A new request: the greedy tokens of a fresh engine.
	if err := c.ResetSeq(bg(t), 0); err != nil {
		t.Fatal(err)
	}
	var got []int32
	toks := p
	for range 24 {
		next, err := c.Decode(bg(t), toks)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, next)
		toks = []int32{next}
	}
	sameTokens(t, "level 2, idle: a new request after the wake against a fresh engine", got, want)
}

// A level-2 sleep of a busy engine: the running sequence's KV cache moves
// to the host tier (as at level 1) and the sequence decodes on after Wake
// with the tokens of an uninterrupted run; the finished sequence's cells
// are discarded and recomputed when it is named again. Without a host
// binding it is refused, nothing changed.
func TestSleepLevel2Busy(t *testing.T) {
	const steps = 24
	p0, p1 := prompt(5, 24, 1024), prompt(6, 40, 1024)
	r := newRig(t, 1<<30)
	tier := r.hostTier(t)
	m := loadModel(t, r.options())
	c, err := m.NewContext(bg(t), ContextOptions{NCtx: 512, Sequences: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(bg(t))
	decode := func(seq int, toks []int32) int32 {
		t.Helper()
		next, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: seq, Tokens: toks}})
		if err != nil {
			t.Fatal(err)
		}
		return next[0]
	}
	run := func(next int32, n int) ([]int32, int32) {
		var out []int32
		for range n {
			out = append(out, next)
			next = decode(0, []int32{next})
		}
		return out, next
	}
	want, _ := run(decode(0, p0), steps)
	if err := c.ResetSeq(bg(t), 0); err != nil {
		t.Fatal(err)
	}
	decode(1, p1)
	if err := c.FinishSeq(1); err != nil {
		t.Fatal(err)
	}
	got, next := run(decode(0, p0), steps/2)
	sums := weightSums(m)
	exactTiers(t, r, tier)
	weights := r.charged(m.Holder())
	kvBefore := c.KV().Committed
	run0 := memapi.Bytes(0) // sequence 0's KV: what must move
	for _, kt := range c.tensors {
		run0 += kt.backed[0]
	}

	if err := m.SleepLevel(bg(t), 2, nil); !errors.Is(err, memapi.ErrNilHandle) || m.Asleep() {
		t.Fatalf("a busy level-2 sleep without a host binding: %v (asleep %v)", err, m.Asleep())
	}
	exactTiers(t, r, tier)
	if r.charged(m.Holder()) != weights || c.KV().Committed != kvBefore {
		t.Fatalf("the refused sleep changed the charges: weights %d (was %d), KV %d (was %d)", r.charged(m.Holder()), weights, c.KV().Committed, kvBefore)
	}

	if err := m.SleepLevel(bg(t), 2, tier.bind); err != nil {
		t.Fatal(err)
	}
	exactTiers(t, r, tier)
	if h := r.chargedOn("sleep", offloadAuth); h != run0 || r.charged(m.Holder()) != 0 || c.KV().Committed != 0 {
		t.Fatalf("asleep: the host tier holds %d (want the running sequence's KV, %d), the device weights %d and KV %d", h, run0, r.charged(m.Holder()), c.KV().Committed)
	}
	residentRegions(t, m, c)
	t.Logf("busy level 2: the running sequence's %d bytes of KV moved, the finished one's %d discarded, %d bytes of weights discarded", run0, kvBefore-run0, weights)
	if err := m.Wake(bg(t)); err != nil {
		t.Fatal(err)
	}
	exactTiers(t, r, tier)
	if r.charged(m.Holder()) != weights || c.KV().Committed != run0 || r.chargedOn("sleep", offloadAuth) != 0 {
		t.Fatalf("awake: weights %d (want %d), KV %d (want %d), host tier %d", r.charged(m.Holder()), weights, c.KV().Committed, run0, r.chargedOn("sleep", offloadAuth))
	}
	sameSums(t, "after the wake", weightSums(m), sums)
	rest, _ := run(next, steps-steps/2)
	sameTokens(t, "level 2, busy: the running sequence across the sleep", append(got, rest...), want)
	// The finished sequence is recomputed when named again.
	before := c.Stats().Recomputed
	decode(1, []int32{1})
	if n := c.Stats().Recomputed - before; n != len(p1) {
		t.Fatalf("sequence 1 recomputed %d tokens, want its %d", n, len(p1))
	}
}

// A weight whose bytes in memory are not the model file's is not
// discarded: its region moves to the host tier as at level 1, the state
// names the tensor, and the bytes come back as they were.
func TestSleepLevel2KeepsWhatIsNotTheFile(t *testing.T) {
	r := newRig(t, 1<<30)
	tier := r.hostTier(t)
	severalRegions(t)
	m := loadModel(t, r.options())
	var w *weightBuffer
	i := -1
	for _, b := range m.bufs {
		if j := slices.IndexFunc(b.tensors, func(t weightTensor) bool { return t.name == "output_norm.weight" }); j >= 0 {
			w, i = b, j
		}
	}
	if i < 0 || len(m.bufs) < 2 {
		t.Fatalf("no output_norm.weight, or the weights in %d region(s)", len(m.bufs))
	}
	mem(w.reg.Addr()+memapi.DeviceAddr(w.tensors[i].off), 1)[0] ^= 1 // as if llama.cpp had converted it
	sums := weightSums(m)
	exactTiers(t, r, tier)
	if err := m.SleepLevel(bg(t), 2, nil); !errors.Is(err, memapi.ErrNilHandle) || m.Asleep() {
		t.Fatalf("a level-2 sleep that must move a region, without a host binding: %v", err)
	}
	if err := m.SleepLevel(bg(t), 2, tier.bind); err != nil {
		t.Fatal(err)
	}
	exactTiers(t, r, tier)
	st := m.SleepState()
	var moved, discarded memapi.Bytes
	for _, b := range m.bufs {
		if b.differs != "" {
			moved += b.size
		} else {
			discarded += b.size
		}
	}
	if st.Level != 2 || len(st.Kept) != 1 || !strings.HasPrefix(st.Kept[0], "output_norm.weight") || st.Moved != moved || moved != w.size ||
		st.Discarded != discarded || discarded == 0 || r.chargedOn("sleep", offloadAuth) != moved || r.charged(m.Holder()) != 0 {
		t.Fatalf("state %+v, host tier %d: want output_norm.weight's region (%d bytes) moved", st, r.chargedOn("sleep", offloadAuth), moved)
	}
	t.Logf("kept: %v; %d bytes moved, %d discarded", st.Kept, st.Moved, st.Discarded)
	if err := m.Wake(bg(t)); err != nil {
		t.Fatal(err)
	}
	exactTiers(t, r, tier)
	sameSums(t, "after the wake", weightSums(m), sums)
}

// The test models' weights are the file's bytes as llama.cpp loaded them
// (F32, F16 and Q8_0 matrices, F32 norms, tied embeddings): a level-2
// sleep discards every region (no host binding needed) and the wake
// gives every tensor its bytes back.
func TestSleepLevel2ModelsStoredAsIs(t *testing.T) {
	r := newRig(t, 1<<30)
	for _, path := range []string{modelPath, gqaModelPath, q8ModelPath} {
		m := loadModelAt(t, path, r.options())
		sums := weightSums(m)
		if err := m.SleepLevel(bg(t), 2, nil); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if st := m.SleepState(); st.Discarded != m.WeightBytes() || len(st.Kept) != 0 {
			t.Fatalf("%s: %+v, want all %d bytes of weights discarded", path, st, m.WeightBytes())
		}
		if err := m.Wake(bg(t)); err != nil {
			t.Fatal(err)
		}
		sameSums(t, path, weightSums(m), sums)
		t.Logf("%s: %d tensors, %d bytes, reloaded", filepath.Base(path), len(sums), m.WeightBytes())
		if err := m.Close(bg(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// A model file that changed or vanished between the sleep and the wake
// fails the wake with a *ModelFileError, and the engine stays asleep with
// nothing committed; once the file is back as loaded, the wake succeeds.
// A level-2 sleep of a model whose file changed since the load is refused.
func TestSleepLevel2ModelFileChanged(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.gguf")
	copyFile(t, modelPath, path)
	r := newRig(t, 1<<30)
	tier := r.hostTier(t)
	m := loadModelAt(t, path, r.options())
	c, err := m.NewContext(bg(t), ContextOptions{NCtx: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(bg(t))
	next, err := c.Decode(bg(t), prompt(2, 20, m.NVocab()))
	if err != nil {
		t.Fatal(err)
	}
	sums := weightSums(m)
	weights := r.charged(m.Holder())
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	mtime := fi.ModTime()
	asleep := func(what string, err error) {
		t.Helper()
		var fe *ModelFileError
		if !errors.As(err, &fe) || !errors.Is(err, ErrModelFile) || fe.Path != path || !m.Asleep() {
			t.Fatalf("%s: %v (asleep %v), want a *ModelFileError and the model asleep", what, err, m.Asleep())
		}
		exactTiers(t, r, tier)
		if st := m.SleepState(); r.charged(m.Holder()) != 0 || st.Discarded != weights {
			t.Fatalf("%s: weights %d charged, state %+v: want all %d still discarded", what, r.charged(m.Holder()), st, weights)
		}
		if _, err := c.Decode(bg(t), []int32{next}); !errors.Is(err, ErrAsleep) {
			t.Fatalf("%s: a decode: %v", what, err)
		}
		t.Logf("%s: %v", what, err)
	}
	wake := func() {
		t.Helper()
		if err := m.Wake(bg(t)); err != nil {
			t.Fatal(err)
		}
		exactTiers(t, r, tier)
		sameSums(t, "after the wake", weightSums(m), sums)
	}

	// Modified (its modification time moves on).
	if err := m.SleepLevel(bg(t), 2, tier.bind); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, time.Time{}, mtime.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	asleep("modified", m.Wake(bg(t)))
	if err := os.Chtimes(path, time.Time{}, mtime); err != nil {
		t.Fatal(err)
	}
	wake()

	// Grown.
	if err := m.SleepLevel(bg(t), 2, tier.bind); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte{0}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	asleep("grown", m.Wake(bg(t)))
	if err := os.Truncate(path, fi.Size()); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, time.Time{}, mtime); err != nil {
		t.Fatal(err)
	}
	wake()

	// Replaced by a copy of itself (another inode).
	if err := m.SleepLevel(bg(t), 2, tier.bind); err != nil {
		t.Fatal(err)
	}
	copyFile(t, modelPath, path+".new")
	if err := os.Chtimes(path+".new", time.Time{}, mtime); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	asleep("replaced", m.Wake(bg(t)))

	// Gone: the open fails; the engine stays asleep and closes clean.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	err = m.Wake(bg(t))
	asleep("removed", err)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("removed: %v, want fs.ErrNotExist inside", err)
	}
	if err := c.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	r.settle(t)
	if s, _ := r.g.Authority(hostAuth); s.Charged != 0 || s.Reserved != 0 || r.mech.UsedBytes() != 0 {
		t.Fatalf("after closing the asleep model: %+v, mechanism %d", s, r.mech.UsedBytes())
	}

	// A level-2 sleep of a model whose file changed since the load.
	copyFile(t, modelPath, path)
	m2 := loadModelAt(t, path, r.options())
	if err := os.Chtimes(path, time.Time{}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	err = m2.SleepLevel(bg(t), 2, tier.bind)
	var fe *ModelFileError
	if !errors.As(err, &fe) || m2.Asleep() {
		t.Fatalf("a level-2 sleep after the file changed: %v (asleep %v)", err, m2.Asleep())
	}
	if r.charged(m2.Holder()) != m2.WeightBytes() {
		t.Fatalf("the refused sleep left %d of %d bytes of weights charged", r.charged(m2.Holder()), m2.WeightBytes())
	}
}

// severalRegions makes the models loaded next spread their weights over
// regions of at most 16 MiB (the tiny model: 5), until the test ends.
func severalRegions(t *testing.T) {
	setMaxBuffer(16 << 20)
	t.Cleanup(func() { setMaxBuffer(0) })
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// stepFaults fails the at-th step counted (from 1 once armed): a
// reservation on one authority (as the governor's Injector) or a step of a
// level-2 sleep or wake (as level2Fault) whose name starts with one of the
// prefixes.
type stepFaults struct {
	mu       sync.Mutex
	auth     memapi.AuthorityID
	prefixes []string
	n, at    int
	failed   string
}

func (f *stepFaults) MaybeError(op memapi.Op) error {
	if op.Layer == "llamacpp" {
		return f.step(op.Name)
	}
	if op.String() != "governor.Reserve" {
		return nil
	}
	a := op.Authority
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at == 0 || a != f.auth {
		return nil
	}
	return f.count("reservation on " + string(a))
}

func (f *stepFaults) step(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at == 0 || !slices.ContainsFunc(f.prefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
		return nil
	}
	return f.count(name)
}

func (f *stepFaults) count(name string) error {
	if f.n++; f.n == f.at {
		f.failed = name
		return errInjected
	}
	return nil
}

func (f *stepFaults) arm(a memapi.AuthorityID, at int, prefixes ...string) {
	f.mu.Lock()
	f.auth, f.at, f.n, f.prefixes, f.failed = a, at, 0, prefixes, ""
	f.mu.Unlock()
}

// A fault at every step of a busy level-2 sleep (each decommit of the
// finished sequence's KV ranges, each move's reservation on the host tier,
// each decommit of a weight region) and of its wake (each region's commit
// reservation, each read of the model file, each KV restore) leaves the
// engine whole: a failed sleep is undone (the weights reloaded, the moves
// restored) and the engine decodes on awake; a failed wake leaves the
// weights all discarded or all back (never a region half loaded) and the
// engine asleep, and the next wake completes. Every step's ledger is exact
// on both tiers, the weights' bytes are as loaded, and the running
// sequence's tokens are those of an uninterrupted run. One engine goes
// through every step: before each try the finished sequence is decoded
// and finished again, so each try takes the same steps.
func TestSleepLevel2FaultAtEveryStep(t *testing.T) {
	const nctx = 256
	severalRegions(t)
	p0, p1 := prompt(5, 24, 1024), prompt(6, 16, 1024)
	// setup loads the model and starts the two sequences: 1 finished, 0
	// running (its first tokens returned).
	setup := func(r *rig) (*Model, *Context, []int32) {
		m := loadModel(t, r.options())
		c, err := m.NewContext(bg(t), ContextOptions{NCtx: 2 * nctx, Sequences: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(bg(t)) })
		if _, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: 1, Tokens: p1}}); err != nil {
			t.Fatal(err)
		}
		if err := c.FinishSeq(1); err != nil {
			t.Fatal(err)
		}
		var got []int32
		toks := p0
		for range 6 {
			next, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: 0, Tokens: toks}})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, next[0])
			toks = next
		}
		return m, c, got
	}
	more := func(c *Context, got []int32, n int) []int32 {
		t.Helper()
		for range n {
			next, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: 0, Tokens: got[len(got)-1:]}})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, next[0])
		}
		return got
	}
	want := func() []int32 {
		r := newRig(t, 1<<30)
		_, c, got := setup(r)
		return more(c, got, 120)
	}()
	inj := &stepFaults{}
	level2Fault = inj
	t.Cleanup(func() { level2Fault = nil })
	// Each region is reloaded in several chunks, read by several readers
	// while the next chunks are committed: a fault in a read finds
	// chunks committed after it.
	defer func(c memapi.Bytes) { wakeChunk = c }(wakeChunk)
	wakeChunk = 1 << 20
	r := newRigWith(t, 1<<30, cpu.Granularity4KiB, governor.Options{Injector: inj})
	tier := r.hostTier(t)
	m, c, got := setup(r)
	sums := weightSums(m)
	weights := r.charged(m.Holder())
	if len(m.bufs) < 2 {
		t.Fatalf("the weights are in %d region(s), want several", len(m.bufs))
	}
	// step decodes the running sequence's next token and checks it.
	step := func(what string) {
		t.Helper()
		exactTiers(t, r, tier)
		sameSums(t, what, weightSums(m), sums)
		if got = more(c, got, 1); len(got) > len(want) {
			t.Fatalf("%s: %d tokens, more than the %d of the uninterrupted run", what, len(got), len(want))
		}
		sameTokens(t, "level 2, "+what, got, want[:len(got)])
	}
	// refinish decodes the finished sequence again and finishes it: the
	// next sleep has its KV ranges to discard again.
	refinish := func() {
		t.Helper()
		if err := c.ResetSeq(bg(t), 1); err != nil {
			t.Fatal(err)
		}
		if _, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: 1, Tokens: p1}}); err != nil {
			t.Fatal(err)
		}
		if err := c.FinishSeq(1); err != nil {
			t.Fatal(err)
		}
	}

	for at := 1; ; at++ {
		exactTiers(t, r, tier)
		inj.arm(offloadAuth, at, "decommit")
		err := m.SleepLevel(bg(t), 2, tier.bind)
		failed := inj.failed
		inj.arm("", 0)
		if err == nil { // every step got past its fault: all covered
			if err := m.Wake(bg(t)); err != nil {
				t.Fatal(err)
			}
			step("after the sleep")
			t.Logf("sleep: a fault at each of its %d steps, then none", at-1)
			break
		}
		what := fmt.Sprintf("sleep failing at step %d (%s)", at, failed)
		if !errors.Is(err, errInjected) || m.Asleep() {
			t.Fatalf("%s: %v (asleep %v), want the fault and the engine awake", what, err, m.Asleep())
		}
		faultExact(t, r, tier, 2, what)
		if h, w := r.chargedOn("sleep", offloadAuth), r.charged(m.Holder()); h != 0 || w != weights {
			t.Fatalf("%s: %d left in the host tier, %d of %d bytes of weights", what, h, w, weights)
		}
		step(what)
		refinish()
	}

	for at := 1; ; at++ {
		if !m.Asleep() {
			refinish()
			if err := m.SleepLevel(bg(t), 2, tier.bind); err != nil {
				t.Fatal(err)
			}
		}
		exactTiers(t, r, tier)
		inj.arm(hostAuth, at, "read")
		err := m.Wake(bg(t))
		failed := inj.failed
		inj.arm("", 0)
		if err == nil {
			step("after the wake")
			t.Logf("wake: a fault at each of its %d steps, then none", at-1)
			break
		}
		what := fmt.Sprintf("wake failing at step %d (%s)", at, failed)
		if !errors.Is(err, errInjected) || !m.Asleep() {
			t.Fatalf("%s: %v (asleep %v)", what, err, m.Asleep())
		}
		faultExact(t, r, tier, 2, what)
		st := m.SleepState()
		if w := r.charged(m.Holder()); st.Discarded != 0 && st.Discarded != weights || w != weights-st.Discarded {
			t.Fatalf("%s: %d bytes of weights discarded, %d charged, of %d: not all or nothing", what, st.Discarded, w, weights)
		}
		if _, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: 0, Tokens: got[len(got)-1:]}}); !errors.Is(err, ErrAsleep) {
			t.Fatalf("%s: a decode: %v", what, err)
		}
		if st.Discarded == weights {
			continue // as asleep as before: the next try takes the same steps
		}
		if err := m.Wake(bg(t)); err != nil {
			t.Fatal(err)
		}
		step(what)
	}
}
