package pool

import "testing"

// TestClassOfEverySize: for every small size, classOf names the smallest
// class that holds it.
func TestClassOfEverySize(t *testing.T) {
	c := 0
	for n := uint64(1); n <= SmallMax; n++ {
		for classSize[c] < n {
			c++
		}
		if got := classOf(n); got != c {
			t.Fatalf("classOf(%d) = %d (%d bytes), want %d (%d bytes)", n, got, classSize[got], c, classSize[c])
		}
	}
}
