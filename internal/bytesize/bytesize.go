// Package bytesize reads and writes byte counts with binary units, the one
// syntax memgen's commands take (memctl's BYTES, memdemo's --budget):
// plain bytes (4096, 4096B), or a number with K, M, G or T, spelled with
// or without "iB" or "B" (64K, 512MiB, 1GiB, 1.5GB, 2t), each a power of
// 1024.
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Max is the largest count Parse accepts (2^62 bytes).
const Max = 1 << 62

// Parse reads a byte count: a non-negative number (a fraction only with a
// unit, and it must come to whole bytes) and an optional unit B, K/KB/KiB,
// M/MB/MiB, G/GB/GiB, T/TB/TiB, any case, all binary.
func Parse(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	var shift uint
	switch strings.ToLower(unit) {
	case "", "b":
	case "k", "kb", "kib":
		shift = 10
	case "m", "mb", "mib":
		shift = 20
	case "g", "gb", "gib":
		shift = 30
	case "t", "tb", "tib":
		shift = 40
	default:
		return 0, fmt.Errorf("size %q: unknown unit %q (use B, KiB, MiB, GiB or TiB)", s, unit)
	}
	if num == "" {
		return 0, fmt.Errorf("size %q has no number", s)
	}
	if !strings.Contains(num, ".") {
		v, err := strconv.ParseUint(num, 10, 64)
		if err != nil || v > Max>>shift {
			if err == nil || isRange(err) {
				return 0, fmt.Errorf("size %q is too large (at most %d bytes)", s, uint64(Max))
			}
			return 0, fmt.Errorf("size %q is not a non-negative number of bytes", s)
		}
		return v << shift, nil
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q is not a non-negative number of bytes", s)
	}
	n := v * float64(uint64(1)<<shift)
	if n > Max {
		return 0, fmt.Errorf("size %q is too large (at most %d bytes)", s, uint64(Max))
	}
	if n != math.Trunc(n) {
		return 0, fmt.Errorf("size %q is not a whole number of bytes", s)
	}
	return uint64(n), nil
}

func isRange(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

// Format writes n with the largest binary unit that divides it (160MiB),
// or in bytes with the unit B (1536B); 0 is "0". Parse reads it back.
func Format(n uint64) string {
	if n == 0 {
		return "0"
	}
	for _, u := range []struct {
		s string
		v uint64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.v && n%u.v == 0 {
			return strconv.FormatUint(n/u.v, 10) + u.s
		}
	}
	return strconv.FormatUint(n, 10) + "B"
}

// Human writes n with a binary unit, rounded to two decimals, for people
// rather than for Parse: 512 B, 1.5 KiB, 96 MiB, 2.25 GiB.
func Human(n uint64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatUint(n, 10) + " B"
	}
	v := float64(n)
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := -1
	for v >= unit && i < len(units)-1 {
		v /= unit
		i++
	}
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) + " " + units[i]
}
