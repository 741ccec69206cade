package plugin

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
)

// TestBadPluginsRefusedAtLoad: a plugin whose entry point or descriptor
// breaks the ABI is refused by Open with a *LoadError of the right kind.
func TestBadPluginsRefusedAtLoad(t *testing.T) {
	for _, c := range []struct {
		name, define string
		kind         error
	}{
		{"missing-entry-symbol", "REFHOST_NO_ENTRY", ErrNoEntry},
		{"null-descriptor", "REFHOST_NULL_DESCRIPTOR", ErrNullDescriptor},
		{"wrong-struct-size", "REFHOST_BAD_STRUCT_SIZE", ErrBadDescriptor},
		{"other-major", "REFHOST_MAJOR=3", ErrIncompatible},
		{"bad-name", `REFHOST_NAME="Not A Name"`, ErrBadDescriptor},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Open(refhost(t, c.define))
			var le *LoadError
			if !errors.Is(err, c.kind) || !errors.As(err, &le) {
				t.Fatalf("Open = %v, want a *LoadError of kind %v", err, c.kind)
			}
		})
	}
	t.Run("no-library", func(t *testing.T) {
		_, err := Open(filepath.Join(t.TempDir(), "absent.so"))
		if !errors.Is(err, ErrNoLibrary) {
			t.Fatalf("Open = %v, want ErrNoLibrary", err)
		}
	})
}

// TestUnknownStatus: a slot returning a status the header does not declare
// fails the call with ErrProtocol; the host keeps running.
func TestUnknownStatus(t *testing.T) {
	m, _ := newSubject(t, refhost(t, "REFHOST_BAD_STATUS"))
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	if !errors.Is(err, ErrProtocol) || a != nil {
		t.Fatalf("Allocate = %v, %v, want ErrProtocol", a, err)
	}
	var e *memapi.Error
	if !errors.As(err, &e) || e.Mechanism != "refhost" {
		t.Errorf("%v is not a *memapi.Error naming the plugin", err)
	}
}

// TestAllowList: without an allow-list any plugin loads under its own name;
// with the spec's, a name it does not list is refused with ErrUndeclared, a
// listed one loads.
func TestAllowList(t *testing.T) {
	path := refhost(t, `REFHOST_NAME="stranger"`)
	l, err := Open(path)
	if err != nil || l.Name != "stranger" {
		t.Fatalf("Open without an allow-list = %v, %v; want plugin stranger", l, err)
	}
	_, err = Open(path, SpecAllowList())
	var le *LoadError
	if !errors.Is(err, ErrUndeclared) || !errors.As(err, &le) || !strings.Contains(le.Detail, "not on the allow-list") {
		t.Fatalf("Open with the spec's allow-list = %v, want a *LoadError of kind ErrUndeclared: not on the allow-list", err)
	}
	if _, err := Open(refhost(t), SpecAllowList()); err != nil {
		t.Fatalf("Open of refhost, which the spec lists: %v", err)
	}
	only := WithAllowList(map[memapi.MechanismID]Allowed{"refhost": {Device: memapi.DeviceKindHost, Offers: memapi.Of(memapi.CapDeviceAllocator)}})
	l, err = Open(refhost(t), only)
	if err != nil || l.Offers() != memapi.Of(memapi.CapDeviceAllocator) {
		t.Fatalf("Open with an allow-list of DeviceAllocator alone = %v, %v", l, err)
	}
}

// TestGarbageHandles: an allocation smaller than asked for is refused with
// ErrProtocol, and what the plugin created for it is given back: UsedBytes
// returns to where it was.
func TestGarbageHandles(t *testing.T) {
	m, _ := newSubject(t, refhost(t, "REFHOST_BAD_HANDLE"))
	before := m.UsedBytes()
	if a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4 * m.Info().AllocGranularity}, g); !errors.Is(err, ErrProtocol) {
		t.Fatalf("Allocate of a short allocation = %v, %v, want ErrProtocol", a, err)
	}
	if got := m.UsedBytes(); got != before {
		t.Errorf("UsedBytes = %d after the refused allocation, want %d: the host gives it back", got, before)
	}
}

// TestLyingCommit: a commit that reports success and installs nothing is
// caught by the checked wrapper's verify mode (ErrUntruthful), with the
// grant's draw given back; bare, the lie shows in CommittedBytes.
func TestLyingCommit(t *testing.T) {
	m, _ := newSubject(t, refhost(t, "REFHOST_BAD_COMMIT"))
	gran := m.Info().Granularity
	wrapped, err := memapi.RequireVirtualBacking(checked.Wrap(m, countingLedger{}, checked.WithVerify()))
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 2 * gran})
	if err != nil {
		t.Fatal(err)
	}
	defer m.ReleaseReservation(bg, res, nil)
	gr := &countingGrant{}
	err = wrapped.Commit(bg, res, memapi.Range{Len: gran}, gr)
	if !errors.Is(err, memapi.ErrUntruthful) {
		t.Fatalf("checked Commit = %v, want ErrUntruthful", err)
	}
	if gr.drawn != 0 {
		t.Errorf("after the refused commit %d bytes stay drawn from the grant, want 0", gr.drawn)
	}
	if err := m.Commit(bg, res, memapi.Range{Off: gran, Len: gran}, g); err != nil {
		t.Fatalf("bare Commit: %v", err)
	}
	if n, _ := m.CommittedBytes(res); n != 0 {
		t.Errorf("CommittedBytes = %d; the lying plugin installed nothing", n)
	}
}

// countingGrant is a grant that records what is drawn.
type countingGrant struct{ drawn memapi.Bytes }

// countingLedger vouches for the test's countingGrant and nothing else: the
// checked wrapper refuses grants of ledgers it was not built with.
type countingLedger struct{}

func (countingLedger) IssuedGrant(g memapi.Grant) (memapi.AuthorityID, bool) {
	if c, ok := g.(*countingGrant); ok {
		return c.Authority(), true
	}
	return "", false
}

func (countingLedger) IssuedAccount(memapi.Account) (memapi.AuthorityID, bool) { return "", false }

func (*countingGrant) Authority() memapi.AuthorityID { return "host" }
func (c *countingGrant) Draw(n memapi.Bytes) error   { c.drawn += n; return nil }
func (c *countingGrant) Undraw(n memapi.Bytes) error { c.drawn -= n; return nil }

// TestPanicContained: a panic on the Go side of a call is returned as
// ErrProtocol, and the mechanism keeps working afterwards.
func TestPanicContained(t *testing.T) {
	m, _ := newSubject(t, refhost(t))
	beforeCall = func(uintptr) { panic("slot exploded") }
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	beforeCall = nil
	if !errors.Is(err, ErrProtocol) || a != nil {
		t.Fatalf("Allocate with a panicking call = %v, %v, want ErrProtocol", a, err)
	}
	a, err = m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	if err != nil {
		t.Fatalf("Allocate after the panic: %v", err)
	}
	if err := m.Free(bg, a, nil); err != nil {
		t.Fatal(err)
	}
}

// TestCallGuards: a call the trampoline cannot make (a nil function, which
// runtime.cgocall would turn into a fatal error, or more arguments than a
// slot takes) fails with an error instead of ending or corrupting the
// process.
func TestCallGuards(t *testing.T) {
	if _, err := callC(0); err == nil || !strings.Contains(err.Error(), "nil function") {
		t.Errorf("callC(0) = %v, want the nil function refused", err)
	}
	m, _ := newSubject(t, refhost(t))
	if _, err := callC(m.lib.da.UsedBytes, m.inst, 1, 2, 3, 4, 5, 6); err == nil || !strings.Contains(err.Error(), "7 arguments") {
		t.Errorf("a call with 7 arguments = %v, want it refused", err)
	}
	if _, err := callC(m.lib.da.UsedBytes, m.inst); err != nil {
		t.Errorf("used_bytes after the refused calls: %v", err)
	}
}

// TestClosed: every call after Close fails with ErrClosed, and Close refuses
// while handles are live.
func TestClosed(t *testing.T) {
	m, err := New(refhost(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); !errors.Is(err, memapi.ErrInUse) {
		t.Fatalf("Close with a live allocation = %v, want ErrInUse", err)
	}
	if err := m.Free(bg, a, nil); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g); !errors.Is(err, memapi.ErrClosed) {
		t.Errorf("Allocate after Close = %v, want ErrClosed", err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

// TestCloseRacesCalls: Close racing calls on other goroutines never crashes
// the host: each call either completes or fails with ErrClosed, Close either
// closes or refuses with ErrInUse while handles are live, and once it closed
// nothing reaches the plugin's freed instance.
func TestCloseRacesCalls(t *testing.T) {
	for round := range 20 {
		m, err := New(refhost(t), Options{})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 4)
		for range 4 {
			go func() {
				for range 50 {
					a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
					if errors.Is(err, memapi.ErrClosed) {
						done <- nil
						return
					}
					if err != nil {
						done <- err
						return
					}
					if err := m.Free(bg, a, nil); err != nil {
						done <- err
						return
					}
					_ = m.UsedBytes()
				}
				done <- nil
			}()
		}
		var closed bool
		for !closed {
			switch err := m.Close(); {
			case err == nil:
				closed = true
			case !errors.Is(err, memapi.ErrInUse):
				t.Fatalf("round %d: Close = %v", round, err)
			}
		}
		for range 4 {
			if err := <-done; err != nil {
				t.Errorf("round %d: %v", round, err)
			}
		}
		if n := m.UsedBytes(); n != 0 {
			t.Errorf("round %d: UsedBytes after Close = %d", round, n)
		}
	}
}
