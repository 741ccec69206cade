package pool_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
	"github.com/memgen/memgen/pool"
)

// ortSeqFile is ONNX Runtime's allocation sequence as integrations/ort's
// allocator saw it (the ONNX conformance models, an MLP, a fan-out model of
// changing batch); its header says how it was recorded.
const ortSeqFile = "testdata/ort-conformance.trace"

// ortOp is one line of the trace: an Alloc ('a') or Reserve ('r') of size
// bytes as block id, or a Free ('f') of block id.
type ortOp struct {
	kind byte
	id   int
	size memapi.Bytes
}

// readORTSeq parses the trace; it also checks that every Free names a
// live block and that nothing is live at the end.
func readORTSeq(tb testing.TB) (ops []ortOp, blocks int) {
	tb.Helper()
	data, err := os.ReadFile(ortSeqFile)
	if err != nil {
		tb.Fatal(err)
	}
	live := map[int]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		f := bytes.Fields(sc.Bytes())
		if len(f) == 0 || f[0][0] == '#' || f[0][0] == 'm' {
			continue
		}
		bad := func(why string) { tb.Fatalf("%s:%d: %s: %q", ortSeqFile, n, why, sc.Text()) }
		if len(f) < 2 {
			bad("short line")
		}
		id, err := strconv.Atoi(string(f[1]))
		if err != nil || id < 0 {
			bad("bad id")
		}
		op := ortOp{kind: f[0][0], id: id}
		switch op.kind {
		case 'a', 'r':
			if len(f) != 3 || live[id] {
				bad("request of a live id, or no size")
			}
			sz, err := strconv.ParseUint(string(f[2]), 10, 63)
			if err != nil || sz == 0 {
				bad("bad size")
			}
			op.size = memapi.Bytes(sz)
			live[id] = true
			blocks = max(blocks, id+1)
		case 'f':
			if !live[id] {
				bad("free of a block not live")
			}
			delete(live, id)
		default:
			bad("unknown op")
		}
		ops = append(ops, op)
	}
	if len(live) != 0 {
		tb.Fatalf("%s: %d blocks live at the end", ortSeqFile, len(live))
	}
	return ops, blocks
}

// ortSeqEnv is a governed CPU mechanism (2 MiB granularity, as
// integrations/ort's tests run it) with a pool over one binding, registered
// as a cache holder, and a bare binding of another holder.
func ortSeqEnv(tb testing.TB) (*pool.Pool, *pmm.Binding, *governor.Governor, func()) {
	tb.Helper()
	const a = memapi.AuthorityID("host")
	check := func(err error) {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
	}
	m, err := cpu.New(cpu.Options{Granularity: cpu.Granularity2MiB, Authority: a})
	check(err)
	ectx := ep.NewContext(cpu.NewContext(m), ep.Options{})
	g := governor.New(governor.Options{})
	check(g.AddAuthority(a, 8<<30))
	mgr := pmm.New(g, pmm.Options{})
	host := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	check(mgr.Register(pmm.Device{Key: host, Mechanism: m, Context: ectx, Authority: a}))
	bp, err := mgr.Bind("ort-pool", "workspace", host)
	check(err)
	bb, err := mgr.Bind("ort-bare", "workspace", host)
	check(err)
	p, err := pool.New(bp, pool.Options{})
	check(err)
	check(g.Register("ort-pool", p, governor.HolderOptions{Cache: true}))
	check(g.Register("ort-bare", nil, governor.HolderOptions{}))
	return p, bb, g, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		check(p.Close())
		check(mgr.Close(ctx))
		check(ectx.Close(ctx, true))
		check(g.Close())
	}
}

// replayORTSeq runs ops, each request through alloc (reserve for 'r'
// lines) and each free through free.
func replayORTSeq[T any](tb testing.TB, ops []ortOp, blocks int, alloc, reserve func(memapi.Bytes) (T, error), free func(T) error) {
	held := make([]T, blocks)
	for _, op := range ops {
		var err error
		switch op.kind {
		case 'a':
			held[op.id], err = alloc(op.size)
		case 'r':
			held[op.id], err = reserve(op.size)
		default:
			err = free(held[op.id])
		}
		if err != nil {
			tb.Fatalf("%c %d %d: %v", op.kind, op.id, op.size, err)
		}
	}
}

// TestORTSequence replays the trace through a pool: every block is
// served, nothing is in use at the end, the pool's cache and in-use bytes
// make up its segments, and its Trim gives everything back.
func TestORTSequence(t *testing.T) {
	ops, blocks := readORTSeq(t)
	p, _, _, done := ortSeqEnv(t)
	defer done()
	ctx := context.Background()
	palloc := func(n memapi.Bytes) (pool.Block, error) { return p.Alloc(ctx, n, nil) }
	replayORTSeq(t, ops, blocks, palloc, palloc, pool.Block.Free)
	s := p.Stats()
	if s.InUse != 0 || s.Requested != 0 || s.Cached != s.Segments || s.Allocs != s.Frees || s.Allocs != uint64(len(ops)/2) {
		t.Errorf("after the replay of %d ops: %+v", len(ops), s)
	}
	if _, err := p.Trim(ctx); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Segments != 0 {
		t.Errorf("after Trim the pool holds %d bytes", s.Segments)
	}
}

// BenchmarkORTSequence replays ONNX Runtime's allocation sequence (the
// trace) through a pool and through the unpooled binding (every request a
// Buffer, as integrations/ort did before the pool), in the same run:
// per-op time of each, their ratio, and the pool's fragmentation (peak
// held / peak requested). as-ort routes Reserve lines to the binding (as
// integrations/ort does: ONNX Runtime reserves what its own arena would
// not cache), so the pool sees the Alloc lines only; all-pooled sends every
// request through the pool.
//
//	go test -run '^$' -bench ORTSequence -benchtime 3x ./pool
func BenchmarkORTSequence(b *testing.B) {
	ops, blocks := readORTSeq(b)
	for _, mode := range []string{"as-ort", "all-pooled"} {
		b.Run(mode, func(b *testing.B) {
			p, bare, _, done := ortSeqEnv(b)
			defer done()
			ctx := context.Background()
			palloc := func(n memapi.Bytes) (ortHeld, error) {
				blk, err := p.Alloc(ctx, n, nil)
				return ortHeld{blk: blk}, err
			}
			balloc := func(n memapi.Bytes) (ortHeld, error) {
				buf, err := bare.Allocate(ctx, n)
				return ortHeld{buf: buf}, err
			}
			preserve := palloc
			if mode == "as-ort" {
				preserve = balloc
			}
			var tPool, tBare time.Duration
			for range b.N {
				t0 := time.Now()
				replayORTSeq(b, ops, blocks, palloc, preserve, ortHeld.free)
				t1 := time.Now()
				replayORTSeq(b, ops, blocks, balloc, balloc, ortHeld.free)
				tBare += time.Since(t1)
				tPool += t1.Sub(t0)
			}
			s := p.Stats()
			n := float64(b.N) * float64(len(ops))
			b.ReportMetric(float64(tPool.Nanoseconds())/n, "pool-ns/op")
			b.ReportMetric(float64(tBare.Nanoseconds())/n, "bare-ns/op")
			b.ReportMetric(float64(tPool)/float64(tBare), "x-vs-unpooled")
			b.ReportMetric(s.PeakFragmentation(), "peak-held/peak-requested")
			b.ReportMetric(float64(s.PeakSegments)/(1<<20), "peak-held-MiB")
			b.ReportMetric(float64(s.PeakRequested)/(1<<20), "peak-requested-MiB")
		})
	}
}

// ortHeld is a pool block or a bare buffer.
type ortHeld struct {
	blk pool.Block
	buf *pmm.Buffer
}

func (h ortHeld) free() error {
	if h.buf != nil {
		return h.buf.Close()
	}
	if err := h.blk.Free(); err != nil {
		return fmt.Errorf("pool block: %w", err)
	}
	return nil
}
