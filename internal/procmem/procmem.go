// Package procmem reads what the kernel says a process holds: its resident
// set and the resident set's high-water mark (VmRSS and VmHWM of
// /proc/PID/status), and resets the mark, so that a command can measure
// the peak growth of its resident set from a baseline it defines.
package procmem

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Usage is a process's resident set now (RSS) and at its highest since the
// process started or the mark was last reset (Peak), in bytes.
type Usage struct {
	RSS, Peak uint64
}

// Self reads this process's usage.
func Self() (Usage, error) { return read("/proc/self/status") }

// Of reads the usage of process pid.
func Of(pid int) (Usage, error) { return read(fmt.Sprintf("/proc/%d/status", pid)) }

// ResetPeak resets this process's high-water mark to its resident set now
// (writing 5 to /proc/self/clear_refs), so that Peak measures from here.
func ResetPeak() error {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// Baseline marks where a measure of this process's memory starts: it
// collects the Go heap, resets the high-water mark and returns the usage
// then, so that a later Peak less the returned RSS is the resident set's
// peak growth since.
func Baseline() (Usage, error) {
	runtime.GC()
	if err := ResetPeak(); err != nil {
		return Usage{}, err
	}
	return Self()
}

func read(path string) (Usage, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Usage{}, err
	}
	var u Usage
	var seen int
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return Usage{}, fmt.Errorf("procmem: %s: %s is %q, not a count of kB", path, k, strings.TrimSpace(v))
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return Usage{}, fmt.Errorf("procmem: %s: %s: %w", path, k, err)
		}
		if k == "VmRSS" {
			u.RSS = n << 10
		} else {
			u.Peak = n << 10
		}
		seen++
	}
	if seen != 2 {
		return Usage{}, fmt.Errorf("procmem: %s has no VmRSS and VmHWM (a kernel thread, or not Linux)", path)
	}
	return u, nil
}
