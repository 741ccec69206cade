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

// TestClassesTable: Classes is the class table, ascending, ending at
// SmallMax, and a copy (a caller cannot change the pool's classes).
func TestClassesTable(t *testing.T) {
	got := Classes()
	if len(got) != numClasses || got[len(got)-1] != SmallMax {
		t.Fatalf("Classes() = %v: want %d classes up to SmallMax", got, numClasses)
	}
	for i, s := range got {
		if s != classSize[i] || (i > 0 && s <= got[i-1]) {
			t.Fatalf("Classes()[%d] = %d, class table %d, previous %v", i, s, classSize[i], got[:i])
		}
	}
	got[0] = 1
	if classSize[0] != 256 {
		t.Fatal("writing the slice Classes returned changed the pool's class table")
	}
}
