package fakestest

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
)

const (
	kib = 1 << 10
	g64 = 64 * kib // the fakes' default granularity
)

var bg = context.Background()

// newFake returns a fake, its context, a large grant and an account, all of
// the fake's authority, cleaned up with the test.
func newFake(t *testing.T, cfg fakes.Config) (*fakes.Mechanism, *fakes.Context, *fakes.Grant, *fakes.Account) {
	t.Helper()
	m := fakes.NewMechanism(cfg)
	c := fakes.NewContext(m)
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("context close: %v", err)
		}
	})
	auth := m.Info().Authority
	return m, c, fakes.NewGrant(auth, 1<<40), fakes.NewAccount(auth)
}

// stream opens a stream closed with the test.
func stream(t *testing.T, c *fakes.Context) memapi.Stream {
	t.Helper()
	s, err := c.NewStream()
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// write copies p to addr through a stream and returns Synchronize's error.
func write(t *testing.T, c *fakes.Context, addr memapi.DeviceAddr, p []byte) error {
	t.Helper()
	s := stream(t, c)
	if err := s.CopyToDevice(addr, p); err != nil {
		t.Fatalf("CopyToDevice enqueue: %v", err)
	}
	return s.Synchronize(bg)
}

// read copies n bytes at addr through a stream.
func read(t *testing.T, c *fakes.Context, addr memapi.DeviceAddr, n int) ([]byte, error) {
	t.Helper()
	s := stream(t, c)
	p := make([]byte, n)
	if err := s.CopyFromDevice(p, addr); err != nil {
		t.Fatalf("CopyFromDevice enqueue: %v", err)
	}
	return p, s.Synchronize(bg)
}

func mustRead(t *testing.T, c *fakes.Context, addr memapi.DeviceAddr, n int) []byte {
	t.Helper()
	p, err := read(t, c, addr, n)
	if err != nil {
		t.Fatalf("read %d bytes at %#x: %v", n, addr, err)
	}
	return p
}

func mustWrite(t *testing.T, c *fakes.Context, addr memapi.DeviceAddr, p []byte) {
	t.Helper()
	if err := write(t, c, addr, p); err != nil {
		t.Fatalf("write %d bytes at %#x: %v", len(p), addr, err)
	}
}

// is fails the test unless err matches kind.
func is(t *testing.T, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("error %v, want %v", err, kind)
	}
}

func ok(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
}

func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i*7)
	}
	return p
}

func eq(t *testing.T, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("bytes differ: got %x..., want %x...", got[:min(16, len(got))], want[:min(16, len(want))])
	}
}

func used(t *testing.T, m *fakes.Mechanism, want memapi.Bytes) {
	t.Helper()
	if got := m.UsedBytes(); got != want {
		t.Fatalf("UsedBytes = %d, want %d", got, want)
	}
}

func committed(t *testing.T, m *fakes.Mechanism, res *memapi.Reservation, want memapi.Bytes) {
	t.Helper()
	got, err := m.CommittedBytes(res)
	ok(t, err)
	if got != want {
		t.Fatalf("CommittedBytes = %d, want %d", got, want)
	}
}
