package procmem

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPeakFollowsTouchedPages: touching 64 MiB of fresh anonymous memory
// raises the peak by about that much over a reset baseline, and unmapping
// it lowers the resident set but not the peak; the peak resets.
func TestPeakFollowsTouchedPages(t *testing.T) {
	base, err := Baseline()
	if err != nil {
		t.Skipf("no baseline here (clear_refs): %v", err)
	}
	const n = 64 << 20
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += os.Getpagesize() {
		b[i] = 1
	}
	held, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Munmap(b); err != nil {
		t.Fatal(err)
	}
	after, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	grew := int64(held.Peak) - int64(base.RSS)
	if grew < n-1<<20 || grew > n+16<<20 {
		t.Errorf("the peak grew by %d bytes over the baseline, want about %d (base %+v, held %+v)", grew, n, base, held)
	}
	// (The kernel's per-thread counters lag by a few pages: 1 MiB of slack.)
	if after.Peak+1<<20 < held.Peak || after.RSS > held.RSS-n/2 {
		t.Errorf("after the unmap %+v: want the peak kept (%d) and the resident set down by about %d from %d", after, held.Peak, n, held.RSS)
	}
	if err := ResetPeak(); err != nil {
		t.Fatal(err)
	}
	if reset, _ := Self(); reset.Peak >= held.Peak {
		t.Errorf("peak %d after the reset, want below %d", reset.Peak, held.Peak)
	}
}

// TestBadPID: a process that does not exist is an error, not zeros.
func TestBadPID(t *testing.T) {
	if _, err := Of(-1); err == nil {
		t.Error("usage of pid -1: want an error")
	}
}
