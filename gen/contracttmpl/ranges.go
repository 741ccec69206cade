//go:build memgentmpl

// memgen:needs Range Bytes

package memapi

import "fmt"

// End returns Off+Len, and false when the sum overflows.
func (r Range) End() (Bytes, bool) {
	e := r.Off + r.Len
	return e, e >= r.Off
}

// Within reports whether r is non-empty and lies inside [0, size).
func (r Range) Within(size Bytes) bool {
	e := r.Off + r.Len // End, whose overflow check is e >= r.Off
	return r.Len > 0 && e >= r.Off && e <= size
}

// Aligned reports whether r's offset and length are multiples of g (g of 0 or 1
// aligns everything).
func (r Range) Aligned(g Bytes) bool {
	if g <= 1 {
		return true
	}
	return r.Off%g == 0 && r.Len%g == 0
}

// Overlaps reports whether r and o share a byte.
func (r Range) Overlaps(o Range) bool {
	return r.Len > 0 && o.Len > 0 && r.Off < o.Off+o.Len && o.Off < r.Off+r.Len
}

func (r Range) String() string {
	return fmt.Sprintf("[%#x, +%#x)", r.Off, r.Len)
}

// RoundUp rounds n up to a multiple of g (g of 0 or 1 leaves n), and reports
// false when the result would overflow.
func RoundUp(n, g Bytes) (Bytes, bool) {
	if g <= 1 {
		return n, true
	}
	r := n % g
	if r == 0 {
		return n, true
	}
	up := n + (g - r)
	return up, up > n
}
