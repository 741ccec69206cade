package ort

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

// The tests need ONNX Runtime and the ONNX conformance models, which
// `make ort` (scripts/ort.sh) fetches outside the repository. Without them
// the package runs no test and says so (see skipAll), unless they are
// required: under CI (CI=true), or with MEMGEN_ORT_REQUIRE=1 (set by `make
// ort-test` after a successful fetch), their absence fails.
var (
	libPath   = envOr("MEMGEN_ORT_LIB", filepath.Join(cacheDir(), "libonnxruntime.so.1"))
	testData  = envOr("MEMGEN_ONNX_TESTDATA", "/usr/share/libonnx-testdata/data")
	benchPath = envOr("MEMGEN_ORT_BENCH_MODEL", filepath.Join(cacheDir(), "mlp24x2048b64.onnx"))
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func cacheDir() string {
	if d := os.Getenv("MEMGEN_ORT_CACHE"); d != "" {
		return d
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "memgen", "ort-"+Version)
}

func TestMain(m *testing.M) {
	missing := ""
	if _, err := os.Stat(libPath); err != nil {
		missing = "ONNX Runtime " + Version + " (" + libPath + ")"
	} else if _, err := os.Stat(filepath.Join(testData, "node")); err != nil {
		missing = "the ONNX conformance models (" + testData + ")"
	}
	if missing != "" {
		if os.Getenv("MEMGEN_ORT_REQUIRE") == "1" || os.Getenv("CI") == "true" {
			fmt.Fprintf(os.Stderr, "integrations/ort: FAIL: %s not found, and CI=true or MEMGEN_ORT_REQUIRE=1 requires it; run `make ort` to fetch it\n", missing)
			os.Exit(1)
		}
		os.Exit(skipAll(m, "integrations/ort: SKIP: "+missing+" not found; run `make ort` to fetch it"))
	}
	if err := Init(libPath, InitOptions{Quiet: true}); err != nil {
		fmt.Fprintln(os.Stderr, "integrations/ort:", err)
		os.Exit(1)
	}
	flag.Parse()
	if *recordPath != "" {
		rec = newRecorder()
	}
	code := m.Run()
	if rec != nil && code == 0 {
		if err := rec.write(*recordPath); err != nil {
			fmt.Fprintln(os.Stderr, "integrations/ort: -record:", err)
			code = 1
		}
	}
	if err := goleak.Find(); err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, "integrations/ort: goroutines outlived the tests:", err)
		code = 1
	}
	if err := Shutdown(); err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, "integrations/ort: Shutdown:", err)
		code = 1
	}
	os.Exit(code)
}

// skipAll runs none of m's tests and reports why where a person sees it.
// A passing package's output is hidden by `go test ./...` unless -v, so
// besides stdout the line goes to the terminal (/dev/tty) when there is one
// and the output is not already shown; and the run matches no test, so
// that the go command's summary line ends in "[no tests to run]" even
// where there is no terminal.
func skipAll(m *testing.M, msg string) int {
	flag.Parse()
	fmt.Println(msg)
	if st, err := os.Stdout.Stat(); !testing.Verbose() && err == nil && st.Mode()&os.ModeCharDevice == 0 {
		if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
			fmt.Fprintln(tty, msg)
			tty.Close()
		}
	}
	if err := flag.Set("test.run", "^$"); err != nil {
		fmt.Fprintln(os.Stderr, "integrations/ort:", err)
		return 1
	}
	return m.Run()
}

const hostAuth memapi.AuthorityID = "host"

// rig is one governed host device: a governor with one authority, the CPU
// mechanism, its device context behind a deferred-free queue, a manager, a
// binding for holder "ort" and an Allocator over it, registered with ONNX
// Runtime.
type rig struct {
	g     *governor.Governor
	m     *cpu.Mechanism
	ectx  *ep.Context
	mgr   *pmm.Manager
	bind  *pmm.Binding
	alloc *Allocator
}

// newHost makes a governed host device: a governor with one authority of
// capacity bytes, the CPU mechanism (2 MiB granularity), its device
// context behind a deferred-free queue, and a manager with the device
// registered. The caller closes them.
func newHost(t testing.TB, capacity memapi.Bytes) (*governor.Governor, *cpu.Mechanism, *ep.Context, *pmm.Manager) {
	t.Helper()
	g := governor.New(governor.Options{})
	if err := g.AddAuthority(hostAuth, capacity); err != nil {
		t.Fatal(err)
	}
	m, err := cpu.New(cpu.Options{Granularity: cpu.Granularity2MiB, Authority: hostAuth})
	if err != nil {
		t.Fatal(err)
	}
	ectx := ep.NewContext(cpu.NewContext(m), ep.Options{})
	mgr := pmm.New(g, pmm.Options{})
	host := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	if err := mgr.Register(pmm.Device{Key: host, Mechanism: m, Context: ectx, Authority: hostAuth}); err != nil {
		t.Fatal(err)
	}
	return g, m, ectx, mgr
}

func newRig(t testing.TB, capacity memapi.Bytes, opts Options) *rig {
	t.Helper()
	g, m, ectx, mgr := newHost(t, capacity)
	host := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	bind, err := mgr.Bind("ort", "session", host)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAllocator(bind, opts)
	if err != nil {
		t.Fatal(err)
	}
	// The allocator is the binding's holder: its caches (the front and
	// the pool's) are what pressure asks first.
	if err := g.Register("ort", a, governor.HolderOptions{Cache: true}); err != nil {
		t.Fatal(err)
	}
	if rec != nil {
		a.setObserve(rec.observe)
	}
	r := &rig{g: g, m: m, ectx: ectx, mgr: mgr, bind: bind, alloc: a}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Error(err)
		}
		// Bounded: a test that failed with blocks still live must not hang
		// here waiting for them.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ectx.Close(ctx, true); err != nil {
			t.Error(err)
		}
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// settle waits until every release ONNX Runtime made reached the mechanism
// and the ledger.
func (r *rig) settle(t testing.TB) {
	t.Helper()
	if err := r.ectx.Queue().Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// audit checks, at a quiescent point, that the ledger, the mechanism, the
// kernel and the pool agree: the holder's charge is the pool's segments
// plus the reserved buffers, the mechanism's bytes and mincore's count are
// the same, nothing is pending; what ONNX Runtime holds is the pool's
// blocks in use plus the reserved buffers less the front cache's blocks
// (in use as the pool counts them), and the pool's cached and in-use bytes
// make up its segments.
func (r *rig) audit(t testing.TB, what string) memapi.Bytes {
	t.Helper()
	r.settle(t)
	s, _ := r.g.Authority(hostAuth)
	st := r.alloc.Stats()
	ps := r.alloc.Pool().Stats()
	used := r.m.UsedBytes()
	kern, err := r.m.KernelBytes()
	if err != nil {
		t.Fatal(err)
	}
	if !s.Balanced() || s.Pending != 0 || s.Reserved != 0 || s.Charged != ps.Segments+st.ReservedBytes || used != s.Charged || kern != used ||
		st.LiveBytes+st.FrontBytes != ps.InUse+st.ReservedBytes || ps.Cached+ps.InUse != ps.Segments {
		t.Errorf("%s: ledger charged %d pending %d reserved %d (balanced %v); allocator holds %d in %d blocks (%d reserved), front caches %d; pool segments %d, in use %d, cached %d; mechanism %d, kernel %d",
			what, s.Charged, s.Pending, s.Reserved, s.Balanced(), st.LiveBytes, st.Live, st.ReservedBytes, st.FrontBytes, ps.Segments, ps.InUse, ps.Cached, used, kern)
	}
	return s.Charged
}

// trim gives the allocator's whole cache back (Allocator.Trim: the front,
// then the pool's) and waits for the refunds.
func (r *rig) trim(t testing.TB) {
	t.Helper()
	if _, err := r.alloc.Trim(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.settle(t)
}

// auditZero is audit after everything ONNX Runtime held was freed: nothing
// is live (the pool's blocks in use are the front's), and once the caches
// are trimmed nothing is charged or in use.
func (r *rig) auditZero(t testing.TB, what string) {
	t.Helper()
	if n := r.audit(t, what); r.alloc.Stats().Live != 0 || r.alloc.Pool().Stats().InUse != r.alloc.Stats().FrontBytes {
		t.Errorf("%s: %d blocks live (%d bytes charged), pool in use %d, front %d", what, r.alloc.Stats().Live, n,
			r.alloc.Pool().Stats().InUse, r.alloc.Stats().FrontBytes)
	}
	r.trim(t)
	if n := r.audit(t, what+", cache trimmed"); n != 0 || r.alloc.Pool().Stats().InUse != 0 || r.alloc.Stats().FrontBlocks != 0 {
		t.Errorf("%s: holder still charged %d bytes (pool in use %d, front %d blocks) after the caches were trimmed",
			what, n, r.alloc.Pool().Stats().InUse, r.alloc.Stats().FrontBlocks)
	}
}
