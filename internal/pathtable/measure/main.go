// Command measure measures the paths of memgen's common operations and
// compares them with docs/pmm.md's path table (package pathtable says how).
// It must be built with coverage of the whole module in atomic mode:
//
//	go run -cover -covermode=atomic -coverpkg=github.com/memgen/memgen/... ./internal/pathtable/measure [-update] [-v]
//
// (make path-table; make path-table-update rewrites the table). It exits 1
// when the table disagrees with what it measured.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/coverage"
	"strings"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/pathtable"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
	"github.com/memgen/memgen/pool"
)

var (
	update  = flag.Bool("update", false, "rewrite docs/pmm.md's path table with what was measured")
	verbose = flag.Bool("v", false, "list every function of each path")
)

// run is what a scenario needs of its runner: a failure ends the command
// (exit 2), cleanups run when the scenario is done.
type run struct{ cleanups []func() }

func (*run) Helper() {}

func (*run) Fatal(args ...any) {
	fmt.Fprintln(os.Stderr, append([]any{"pathtable:"}, args...)...)
	os.Exit(2)
}

func (r *run) Fatalf(format string, args ...any) { r.Fatal(fmt.Sprintf(format, args...)) }

func (r *run) Error(args ...any) { r.Fatal(args...) }

func (r *run) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

func (r *run) done() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

const (
	module   = "github.com/memgen/memgen"
	auth     = memapi.AuthorityID("host")
	docPath  = "docs/pmm.md"
	docBegin = "<!-- path table: make path-table-update rewrites it -->"
	docEnd   = "<!-- end of path table -->"
)

// stack is the real stack over the CPU mechanism (4 KiB granularity).
type stack struct {
	g    *governor.Governor
	ectx *ep.Context
	mgr  *pmm.Manager
	dev  memapi.DeviceKey
}

func newStack(t *run) *stack {
	t.Helper()
	g := governor.New(governor.Options{})
	if err := g.AddAuthority(auth, 1<<30); err != nil {
		t.Fatal(err)
	}
	m, err := cpu.New(cpu.Options{Granularity: cpu.Granularity4KiB, Authority: auth})
	if err != nil {
		t.Fatal(err)
	}
	ectx := ep.NewContext(cpu.NewContext(m), ep.Options{})
	mgr := pmm.New(g, pmm.Options{})
	dev := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	if err := mgr.Register(pmm.Device{Key: dev, Mechanism: m, Context: ectx, Authority: auth}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ectx.Close(context.Background(), true); err != nil {
			t.Error(err)
		}
		g.Close()
	})
	return &stack{g: g, ectx: ectx, mgr: mgr, dev: dev}
}

func (s *stack) bind(t *run, holder string) *pmm.Binding {
	t.Helper()
	if err := s.g.Register(governor.HolderID(holder), nil, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := s.mgr.Bind(holder, "path", s.dev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (s *stack) drain(t *run) {
	t.Helper()
	if err := s.ectx.Queue().Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// goals are the most each path may enter (memgen's functions and files, the
// mechanism's own apart).
var goals = map[string]string{
	"`Binding.Allocate`":                             "≤ 20 functions in ≤ 8 files",
	"`Binding.Allocate` + `Buffer.Close`":            "≤ 40 functions",
	"`Region.Grow`":                                  "≤ 25 functions",
	"the pool's slow path (`Pool.Alloc` that grows)": "≤ 40 functions",
}

// scenario is one measured call: prepare sets it up (and warms what runs
// once per process or per holder), call is what is measured.
type scenario struct {
	name    string
	prepare func(t *run, s *stack) (call func())
}

var ctx = context.Background()

func scenarios() []scenario {
	return []scenario{
		{"`Binding.Allocate`", func(t *run, s *stack) func() {
			b := s.bind(t, "a")
			warm(t, b)
			return func() {
				buf, err := b.Allocate(ctx, 64<<10)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = buf.Close(); s.drain(t) })
			}
		}},
		{"`Binding.Allocate` + `Buffer.Close`", func(t *run, s *stack) func() {
			b := s.bind(t, "a")
			warm(t, b)
			return func() {
				buf, err := b.Allocate(ctx, 64<<10)
				if err != nil {
					t.Fatal(err)
				}
				if err := buf.Close(); err != nil { // no fence pending: freed and refunded in the call
					t.Fatal(err)
				}
			}
		}},
		{"`Region.Grow`", func(t *run, s *stack) func() {
			b := s.bind(t, "a")
			r, err := b.ReserveVirtual(ctx, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.Close(); s.drain(t) })
			if err := r.Grow(ctx, 64<<10, nil); err != nil { // warm
				t.Fatal(err)
			}
			return func() {
				if err := r.Grow(ctx, 128<<10, nil); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"`Region.Close`", func(t *run, s *stack) func() {
			b := s.bind(t, "a")
			warmRegion(t, s, b)
			r, err := b.ReserveVirtual(ctx, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Grow(ctx, 128<<10, nil); err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := r.Close(); err != nil { // no fence pending: freed and refunded in the call
					t.Fatal(err)
				}
			}
		}},
		{"the pool's slow path (`Pool.Alloc` that grows)", func(t *run, s *stack) func() {
			// New reserves a pool's region (address space, once per pool);
			// a first Alloc of 2 MiB commits its first 2 MiB (and the
			// holder's account) and fills it, so the measured Alloc must
			// grow the region. A first pool runs the same steps to warm
			// the pool's code.
			for i, holder := range []string{"pool-warm", "pool"} {
				p, err := pool.New(s.bind(t, holder), pool.Options{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = p.Close(); s.drain(t) })
				alloc := func(n memapi.Bytes) {
					blk, err := p.Alloc(ctx, n, nil)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = p.Free(blk) })
				}
				alloc(2 << 20)
				if i == 0 {
					alloc(1 << 20)
					continue
				}
				before := p.Stats().SegmentAllocs
				t.Cleanup(func() {
					if p.Stats().SegmentAllocs != before+1 {
						t.Fatal("the measured Alloc did not grow the pool's region")
					}
				})
				return func() { alloc(1 << 20) }
			}
			return nil
		}},
	}
}

// warm runs an Allocate and a Close on b once, so that what runs once
// (the holder's account on the authority, lazy initializations) is not
// counted in the path.
func warm(t *run, b *pmm.Binding) {
	t.Helper()
	buf, err := b.Allocate(ctx, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if err := buf.Close(); err != nil {
		t.Fatal(err)
	}
}

func warmRegion(t *run, s *stack, b *pmm.Binding) {
	t.Helper()
	r, err := b.ReserveVirtual(ctx, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Grow(ctx, 64<<10, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	s.drain(t)
}

func main() {
	flag.Parse()
	t := &run{}
	// Writing the meta-data first also reads the counter mode, which
	// ClearCounters checks.
	err := coverage.WriteMeta(io.Discard)
	if err == nil {
		err = coverage.ClearCounters()
	}
	if err != nil {
		t.Fatalf("not built with -cover -covermode=atomic -coverpkg=%s/...: %v (make path-table runs it so)", module, err)
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("no go command to convert the counters:", err)
	}
	wd, _ := os.Getwd()
	root, err := pathtable.ModuleRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	paths := map[string]pathtable.Path{}
	for _, sc := range scenarios() {
		// Each call is measured three times, each on a new stack, and a
		// function counts when all three entered it: a goroutine that
		// a step before the call woke (the queue's, once it drained)
		// may still run during one of them.
		var runs []pathtable.Path
		for range 3 {
			s := newStack(t)
			call := sc.prepare(t, s)
			s.drain(t)
			runs = append(runs, measure(t, goTool, root, call))
			// Nothing the call started is left behind its return:
			// the path measured is all of it.
			if q := s.ectx.Queue().Stats().Pending; q != 0 {
				t.Fatalf("%s: %d releases still queued after the call", sc.name, q)
			}
			t.done()
		}
		p := pathtable.Common(runs...)
		names = append(names, sc.name)
		paths[sc.name] = p
		if *verbose {
			fmt.Printf("%s: %d functions in %d files:\n  %s\n  files: %s\n", sc.name, len(p.Functions), len(p.Files),
				strings.Join(p.Functions, "\n  "), strings.Join(p.Files, " "))
		}
	}
	table := pathtable.Table(names, paths, goals)
	fmt.Print(table)
	doc, err := os.ReadFile(filepath.Join(root, docPath))
	if err != nil {
		t.Fatal(err)
	}
	next, err := pathtable.Replace(string(doc), docBegin, docEnd, table)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case next == string(doc):
		fmt.Println("pathtable:", docPath, "agrees")
	case *update:
		if err := os.WriteFile(filepath.Join(root, docPath), []byte(next), 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Println("pathtable: rewrote", docPath)
	default:
		fmt.Fprintf(os.Stderr, "pathtable: %s's path table disagrees with what was measured (make path-table-update rewrites it)\n", docPath)
		os.Exit(1)
	}
}

// measure clears the counters, runs call, and maps what ran to functions.
func measure(t *run, goTool, root string, call func()) pathtable.Path {
	t.Helper()
	dir, err := os.MkdirTemp("", "pathtable")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := coverage.ClearCounters(); err != nil {
		t.Fatal(err)
	}
	call()
	if err := coverage.WriteMetaDir(dir); err != nil {
		t.Fatal(err)
	}
	if err := coverage.WriteCountersDir(dir); err != nil {
		t.Fatal(err)
	}
	prof := filepath.Join(dir, "profile.txt")
	if out, err := exec.Command(goTool, "tool", "covdata", "textfmt", "-i="+dir, "-o="+prof).CombinedOutput(); err != nil {
		t.Fatalf("go tool covdata: %v\n%s", err, out)
	}
	f, err := os.Open(prof)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blocks, err := pathtable.ParseProfile(f)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pathtable.Measure(blocks, module, root, "internal/pathtable/measure")
	if err != nil {
		t.Fatal(err)
	}
	return p
}
