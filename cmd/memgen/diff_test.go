package main

import (
	"fmt"
	"strings"
	"testing"
)

// TestUnifiedDiff compares unifiedDiff with what GNU diff -u prints for the
// same inputs.
func TestUnifiedDiff(t *testing.T) {
	abc := "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\nm\n"
	for _, tc := range []struct {
		name, a, b, want string
	}{
		{"equal", abc, abc, ""},
		{"two hunks and a missing final newline", abc, "a\nb\nX\nc\nd\ne\nf\ng\nh\ni\nj\nl\nm", `--- A
+++ B
@@ -1,5 +1,6 @@
 a
 b
+X
 c
 d
 e
@@ -8,6 +9,5 @@
 h
 i
 j
-k
 l
-m
+m
\ No newline at end of file
`},
		{"from empty", "", "a\nb\n", "--- A\n+++ B\n@@ -0,0 +1,2 @@\n+a\n+b\n"},
		{"to empty", "a\n", "", "--- A\n+++ B\n@@ -1 +0,0 @@\n-a\n"},
		{"changes close together share a hunk", abc, strings.Replace(strings.Replace(abc, "c\n", "C\n", 1), "h\n", "H\n", 1), `--- A
+++ B
@@ -1,11 +1,11 @@
 a
 b
-c
+C
 d
 e
 f
 g
-h
+H
 i
 j
 k
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := unifiedDiff("A", "B", []byte(tc.a), []byte(tc.b), 100); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// TestUnifiedDiffCut: a long diff stops after max lines and says so.
func TestUnifiedDiffCut(t *testing.T) {
	got := unifiedDiff("A", "B", nil, []byte(strings.Repeat("x\n", 50)), 10)
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if len(lines) != 2+10+1 || lines[len(lines)-1] != "... (diff cut after 10 lines)" {
		t.Errorf("got %d lines:\n%s", len(lines), got)
	}
}

// TestUnifiedDiffLarge: past maxDiffCells the changed middle is removed and
// added whole, still a correct diff.
func TestUnifiedDiffLarge(t *testing.T) {
	var a, b strings.Builder
	for i := range 3000 {
		fmt.Fprintf(&a, "a%d\n", i)
		fmt.Fprintf(&b, "b%d\n", i)
	}
	got := unifiedDiff("A", "B", []byte("head\n"+a.String()+"tail\n"), []byte("head\n"+b.String()+"tail\n"), 1<<20)
	if !strings.HasPrefix(got, "--- A\n+++ B\n@@ -1,3002 +1,3002 @@\n head\n-a0\n-a1\n") || strings.Count(got, "\n-") != 3000 || strings.Count(got, "\n+") != 3001 {
		t.Errorf("unexpected diff: %.200s", got)
	}
}
