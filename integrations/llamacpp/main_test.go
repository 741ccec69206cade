package llamacpp

import (
	"context"
	"errors"
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

// The tests need llama.cpp's libraries, the release's headers and a model,
// which `make llamacpp` (scripts/llamacpp.sh) fetches and writes outside
// the repository. Without them the package runs no test and says so
// (skipAll), unless they are required: under CI (CI=true), or with
// MEMGEN_LLAMACPP_REQUIRE=1 (set by `make llamacpp-test` after a
// successful fetch), their absence fails.
var (
	libPath   = envOr("MEMGEN_LLAMACPP_LIB", filepath.Join(cacheDir(), "lib", LibName))
	srcDir    = envOr("MEMGEN_LLAMACPP_SRC", filepath.Join(cacheDir(), "src"))
	modelPath = envOr("MEMGEN_LLAMACPP_MODEL", filepath.Join(cacheDir(), "tiny-llama-w3-seed1.gguf"))
	// gqaModelPath is the second shape: 8 layers, GQA 4:1, head size 128,
	// F16, a real vocabulary (gguf.GQAShape).
	gqaModelPath = envOr("MEMGEN_LLAMACPP_GQA_MODEL", filepath.Join(cacheDir(), "gqa-llama2-f16-seed1.gguf"))
	// q8ModelPath is the GQA model with its matrices in Q8_0.
	q8ModelPath = envOr("MEMGEN_LLAMACPP_Q8_MODEL", filepath.Join(cacheDir(), "gqa-llama2-q8_0-seed1.gguf"))
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func cacheDir() string {
	if d := os.Getenv("MEMGEN_LLAMACPP_CACHE"); d != "" {
		return d
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "memgen", "llamacpp-"+Version)
}

func required() bool {
	return os.Getenv("MEMGEN_LLAMACPP_REQUIRE") == "1" || os.Getenv("CI") == "true"
}

func TestMain(m *testing.M) {
	// A child process of a test or benchmark runs its own body and
	// nothing else.
	switch os.Getenv(childEnv) {
	case "":
	case "rss-stock", "rss-memgen":
		os.Exit(memChild(os.Getenv(childEnv) == "rss-stock"))
	case "ledger":
		os.Exit(ledgerChild())
	case "plan-rss":
		os.Exit(planRSSChild())
	default:
		os.Exit(runChild())
	}
	missing := ""
	for _, p := range []struct{ what, path string }{
		{"llama.cpp (node-llama-cpp " + Version + ")", libPath},
		{"the model", modelPath},
		{"the GQA model", gqaModelPath},
		{"the Q8_0 GQA model", q8ModelPath},
	} {
		if _, err := os.Stat(p.path); err != nil && missing == "" {
			missing = p.what + " (" + p.path + ")"
		}
	}
	if missing != "" {
		if required() {
			fmt.Fprintf(os.Stderr, "integrations/llamacpp: FAIL: %s not found, and CI=true or MEMGEN_LLAMACPP_REQUIRE=1 requires it; run `make llamacpp` to fetch it\n", missing)
			os.Exit(1)
		}
		os.Exit(skipAll(m, "integrations/llamacpp: SKIP: "+missing+" not found; run `make llamacpp` to fetch it"))
	}
	if err := Init(libPath); err != nil {
		fmt.Fprintln(os.Stderr, "integrations/llamacpp:", err)
		os.Exit(1)
	}
	Verbose(os.Getenv("MEMGEN_LLAMACPP_VERBOSE") == "1")
	code := m.Run()
	if err := goleak.Find(); err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, "integrations/llamacpp: goroutines outlived the tests:", err)
		code = 1
	}
	os.Exit(code)
}

// skipAll runs none of m's tests and reports why where a person sees it
// (as integrations/ort does): on stdout, on the terminal when the output
// is hidden, and as "[no tests to run]" in the go command's summary.
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
		fmt.Fprintln(os.Stderr, "integrations/llamacpp:", err)
		return 1
	}
	return m.Run()
}

const hostAuth memapi.AuthorityID = "host"

// rig is one governed host device: a governor with one authority, the CPU
// mechanism at 4 KiB granularity, its device context behind a
// deferred-free queue, and a manager with the device registered.
type rig struct {
	g    *governor.Governor
	mech *cpu.Mechanism
	ectx *ep.Context
	mgr  *pmm.Manager
	host memapi.DeviceKey
	// extra is what holders other than the model's hold.
	extra memapi.Bytes
}

func newRig(t testing.TB, capacity memapi.Bytes) *rig {
	t.Helper()
	return newRigGranule(t, capacity, cpu.Granularity4KiB)
}

// newRigGranule is newRig with the mechanism's commit granularity gran.
func newRigGranule(t testing.TB, capacity, gran memapi.Bytes) *rig {
	t.Helper()
	return newRigWith(t, capacity, gran, governor.Options{})
}

// newRigWith is newRigGranule with the governor's options.
func newRigWith(t testing.TB, capacity, gran memapi.Bytes, gopts governor.Options) *rig {
	t.Helper()
	g := governor.New(gopts)
	if err := g.AddAuthority(hostAuth, capacity); err != nil {
		t.Fatal(err)
	}
	mech, err := cpu.New(cpu.Options{Granularity: gran, Authority: hostAuth})
	if err != nil {
		t.Fatal(err)
	}
	ectx := ep.NewContext(cpu.NewContext(mech), ep.Options{})
	mgr := pmm.New(g, pmm.Options{})
	host := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	if err := mgr.Register(pmm.Device{Key: host, Mechanism: mech, Context: ectx, Authority: hostAuth}); err != nil {
		t.Fatal(err)
	}
	r := &rig{g: g, mech: mech, ectx: ectx, mgr: mgr, host: host}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := mgr.Close(ctx); err != nil {
			t.Error(err)
		}
		if err := ectx.Close(ctx, true); err != nil {
			t.Error(err)
		}
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

func (r *rig) options() Options {
	return Options{Manager: r.mgr, Governor: r.g, Device: r.host}
}

// settle waits until every release reached the mechanism and the ledger.
func (r *rig) settle(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.ectx.Queue().Drain(ctx); err != nil {
		t.Fatal(err)
	}
}

// other registers a holder "other" that reclaims nothing and binds it
// ("blocks") on the host device: another holder's reservations, closed
// with the test.
func (r *rig) other(t testing.TB) *pmm.Binding {
	t.Helper()
	if err := r.g.Register("other", nil, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := r.mgr.Bind("other", "blocks", r.host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// charged is the holder's charge on the host authority.
func (r *rig) charged(h governor.HolderID) memapi.Bytes {
	for _, hs := range r.g.Snapshot().Holders {
		if hs.ID == h {
			for _, a := range hs.Authorities {
				if a.Authority == hostAuth {
					return a.Charged
				}
			}
		}
	}
	return 0
}

func bg(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func loadModel(t testing.TB, opts Options) *Model {
	t.Helper()
	return loadModelAt(t, modelPath, opts)
}

// loadModelAt is loadModel of the model at path.
func loadModelAt(t testing.TB, path string, opts Options) *Model {
	t.Helper()
	m, err := LoadModel(bg(t), path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(context.Background()); err != nil && !isClosed(err) {
			t.Error(err)
		}
	})
	return m
}

func isClosed(err error) bool { return errors.Is(err, memapi.ErrClosed) }

// newChildRig is newRig for a child process (no testing.T).
func newChildRig() (*rig, func(), error) {
	g := governor.New(governor.Options{})
	if err := g.AddAuthority(hostAuth, 1<<30); err != nil {
		return nil, nil, err
	}
	mech, err := cpu.New(cpu.Options{Granularity: cpu.Granularity4KiB, Authority: hostAuth})
	if err != nil {
		return nil, nil, err
	}
	ectx := ep.NewContext(cpu.NewContext(mech), ep.Options{})
	mgr := pmm.New(g, pmm.Options{})
	host := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	if err := mgr.Register(pmm.Device{Key: host, Mechanism: mech, Context: ectx, Authority: hostAuth}); err != nil {
		return nil, nil, err
	}
	return &rig{g: g, mech: mech, ectx: ectx, mgr: mgr, host: host}, func() {}, nil
}
