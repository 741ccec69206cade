package plugin

import (
	"errors"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
)

// TestCompatibility is the version matrix: this host (ABI 1.1) against the
// reference plugin built as ABI 1.0 (smaller structs: no copy_on_write), as
// a newer 1.2 (every struct one slot longer, a slot that aborts the process
// if it is ever called), and as major 2.
func TestCompatibility(t *testing.T) {
	t.Run("older-minor", func(t *testing.T) {
		l, err := Open(refhost(t, "REFHOST_MINOR=0"))
		if err != nil {
			t.Fatal(err)
		}
		if got := minorOf(l.Version); got != 0 {
			t.Fatalf("plugin minor %d, want 0", got)
		}
		want := memapi.Of(memapi.CapDeviceAllocator, memapi.CapVirtualBacking)
		if l.Offers() != want {
			t.Errorf("Offers() = %v, want %v: a 1.0 plugin lacks the copy_on_write slot, so SharedMapping is absent", l.Offers(), want)
		}
		m, c := newSubject(t, l.Path)
		if got := memapi.Negotiate(m); got != want {
			t.Errorf("Negotiate = %v, want %v", got, want)
		}
		if _, err := memapi.RequireSharedMapping(checked.Wrap(m, checked.NoLedger)); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("RequireSharedMapping = %v, want ErrUnsupported", err)
		}
		// What it has works (the conformance run below checks all of it).
		vb, err := memapi.RequireVirtualBacking(m)
		if err != nil {
			t.Fatal(err)
		}
		_ = c
		res, err := vb.Reserve(bg, memapi.ReserveRequest{Size: 4 * m.Info().Granularity})
		if err != nil {
			t.Fatal(err)
		}
		if err := vb.ReleaseReservation(bg, res, nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("older-minor/stale-slot", func(t *testing.T) {
		// struct_size covers copy_on_write, abi_version says 1.0: the minor wins.
		l, err := Open(refhost(t, "REFHOST_MINOR=0", "REFHOST_STALE_SLOT"))
		if err != nil {
			t.Fatal(err)
		}
		if l.Offers().Has(memapi.CapSharedMapping) {
			t.Errorf("Offers() = %v: a 1.0 plugin has no copy_on_write, whatever its struct_size", l.Offers())
		}
	})
	t.Run("older-minor/conformance", func(t *testing.T) {
		path := refhost(t, "REFHOST_MINOR=0")
		conformance.Run(t, func(t *testing.T) conformance.Subject {
			m, c := newSubject(t, path)
			return conformance.Subject{Mechanism: checked.Wrap(m, conformance.Ledger, checked.WithVerify()), Context: c}
		})
	})
	t.Run("newer-minor/conformance", func(t *testing.T) {
		path := refhost(t, "REFHOST_NEWER_MINOR")
		l, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := minorOf(l.Version); got != ABIMinor+1 {
			t.Fatalf("plugin minor %d, want %d", got, ABIMinor+1)
		}
		if want := memapi.Of(memapi.CapDeviceAllocator, memapi.CapVirtualBacking, memapi.CapSharedMapping); l.Offers() != want {
			t.Fatalf("Offers() = %v, want %v", l.Offers(), want)
		}
		// The suite exercises every slot this host knows; the extra slot
		// aborts the process if the host ever called it.
		conformance.Run(t, func(t *testing.T) conformance.Subject {
			m, c := newSubject(t, path)
			return conformance.Subject{Mechanism: checked.Wrap(m, conformance.Ledger, checked.WithVerify()), Context: c}
		})
	})
	t.Run("other-major", func(t *testing.T) {
		_, err := Open(refhost(t, "REFHOST_MAJOR=2"))
		var le *LoadError
		if !errors.Is(err, ErrIncompatible) || !errors.As(err, &le) {
			t.Fatalf("Open = %v, want a *LoadError of kind ErrIncompatible", err)
		}
		// The descriptor's version is judged first; nothing past it is read.
		if !strings.Contains(le.Detail, "the plugin speaks ABI 2.") {
			t.Errorf("Open = %v: the descriptor's own major was not what refused it", err)
		}
	})
	t.Run("other-major-slots", func(t *testing.T) {
		_, err := Open(refhost(t, "REFHOST_SLOTS_MAJOR=2"))
		var le *LoadError
		if !errors.Is(err, ErrIncompatible) || !errors.As(err, &le) || !strings.Contains(le.Detail, "device_allocator is of ABI 2.") {
			t.Fatalf("Open = %v, want ErrIncompatible for the device_allocator struct", err)
		}
	})
}

// TestClearNewer: the host never calls a slot newer than the plugin's minor,
// even when the plugin's struct_size claims room for it.
func TestClearNewer(t *testing.T) {
	v := cSharedMapping{CopyOnWrite: 1, CreateBacking: 1}
	v.clearNewer(0)
	if v.CopyOnWrite != 0 || v.CreateBacking == 0 {
		t.Errorf("clearNewer(0) left %+v, want copy_on_write cleared and create_backing kept", v)
	}
	v = cSharedMapping{CopyOnWrite: 1}
	v.clearNewer(1)
	if v.CopyOnWrite == 0 {
		t.Errorf("clearNewer(1) cleared copy_on_write, which minor 1 has")
	}
}
