package plugin

import (
	"errors"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
)

// TestCompatibility is the version matrix: this host (ABI 2.0, the first
// released major) against the reference plugin built as a newer 2.1 (every
// struct one slot longer, a slot that aborts the process if it is ever
// called), and as major 3 (the descriptor, or only a struct of slots).
func TestCompatibility(t *testing.T) {
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
			d := l.Declaration()
			return conformance.Subject{Mechanism: checked.Wrap(m, conformance.Ledger, checked.WithVerify()), Context: c, Declared: &d}
		})
	})
	t.Run("other-major", func(t *testing.T) {
		_, err := Open(refhost(t, "REFHOST_MAJOR=3"))
		var le *LoadError
		if !errors.Is(err, ErrIncompatible) || !errors.As(err, &le) {
			t.Fatalf("Open = %v, want a *LoadError of kind ErrIncompatible", err)
		}
		// The descriptor's version is judged first; nothing past it is read.
		if !strings.Contains(le.Detail, "the plugin speaks ABI 3.") {
			t.Errorf("Open = %v: the descriptor's own major was not what refused it", err)
		}
	})
	t.Run("other-major-slots", func(t *testing.T) {
		_, err := Open(refhost(t, "REFHOST_SLOTS_MAJOR=3"))
		var le *LoadError
		if !errors.Is(err, ErrIncompatible) || !errors.As(err, &le) || !strings.Contains(le.Detail, "device_allocator is of ABI 3.") {
			t.Fatalf("Open = %v, want ErrIncompatible for the device_allocator struct", err)
		}
	})
}
