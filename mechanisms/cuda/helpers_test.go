package cuda

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// Tests run against the simulated driver, or against libcuda.so.1 on a GPU
// machine when MEMGEN_CUDA=real (scripts/gpu-check.sh sets it).
func realDriver() bool { return os.Getenv("MEMGEN_CUDA") == "real" }

// TestMain pins device 0 for the whole run on the real driver, so the
// hundreds of mechanisms the tests open and close share one primary context
// instead of creating and destroying it each time; then it checks that no
// goroutine outlived the tests.
//
// A run of the probes alone (-test.run '^TestGPUProbe', as gpu-check runs
// them first) goes on when the device does not open: the probes report what
// each call answered, which is what such a run is for.
func TestMain(m *testing.M) {
	flag.Parse()
	var pin *DevicePin
	if realDriver() {
		var err error
		if pin, err = PinDevice(Config{}); err != nil {
			fmt.Fprintln(os.Stderr, "MEMGEN_CUDA=real but the device does not open:", err)
			if !strings.HasPrefix(flag.Lookup("test.run").Value.String(), "^TestGPUProbe") {
				os.Exit(1)
			}
		}
	}
	code := m.Run()
	if pin != nil {
		_ = pin.Close()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testDriver returns the driver table for a test: a fresh simulator built
// from cfg, or the real driver (sim nil) when MEMGEN_CUDA=real.
func testDriver(t testing.TB, cfg cudasim.Config) (*driver.Table, *cudasim.Sim) {
	t.Helper()
	if realDriver() {
		tbl, err := driver.Open()
		if err != nil {
			t.Fatalf("MEMGEN_CUDA=real but the driver does not load: %v", err)
		}
		return tbl, nil
	}
	sim := cudasim.New(cfg)
	return sim.Table(), sim
}

// simOnly skips a test that needs the simulator's controls.
func simOnly(t testing.TB) {
	t.Helper()
	if realDriver() {
		t.Skip("needs the simulated driver")
	}
}

// newMech returns a mechanism over a fresh driver and closes it at cleanup,
// failing the test if anything was still live.
func newMech(t testing.TB, simCfg cudasim.Config, cfg Config) (*Mechanism, *cudasim.Sim) {
	t.Helper()
	tbl, sim := testDriver(t, simCfg)
	cfg.Driver = tbl
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m, sim
}

// grant is a minimal grant and account for the mechanism's own tests (the
// bare mechanism never draws; it only needs a non-nil grant).
type grant struct{ auth memapi.AuthorityID }

func (g grant) Authority() memapi.AuthorityID { return g.auth }
func (grant) Draw(memapi.Bytes) error         { return nil }
func (grant) Undraw(memapi.Bytes) error       { return nil }
func (grant) Refund(memapi.Bytes) error       { return nil }

func grantFor(m *Mechanism) grant { return grant{m.Info().Authority} }

var bg = context.Background()

// stream opens a stream on a fresh context of m, closed at cleanup.
func stream(t testing.TB, m *Mechanism) memapi.Stream {
	t.Helper()
	c, err := m.NewContext()
	if err != nil {
		t.Fatalf("NewContext: %v", err)
	}
	s, err := c.NewStream()
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Stream.Close: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Context.Close: %v", err)
		}
	})
	return s
}

func write(t testing.TB, s memapi.Stream, addr memapi.DeviceAddr, data []byte) error {
	t.Helper()
	if err := s.CopyToDevice(addr, data); err != nil {
		return err
	}
	return s.Synchronize(bg)
}

func read(t testing.TB, s memapi.Stream, addr memapi.DeviceAddr, n int) ([]byte, error) {
	t.Helper()
	b := make([]byte, n)
	if err := s.CopyFromDevice(b, addr); err != nil {
		return nil, err
	}
	return b, s.Synchronize(bg)
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}
