package main

import (
	"fmt"
	"strings"
)

// maxDiffLines is how many lines of a drifting file's diff memgen check
// prints before it cuts the diff short.
const maxDiffLines = 200

// diffContext is the number of unchanged lines around each change.
const diffContext = 3

// maxDiffCells bounds the work of the line matching: when the part of the
// two files between their common head and tail is larger than this many
// line pairs, the diff removes that whole part and adds the new one
// instead of matching lines inside it.
const maxDiffCells = 4 << 20

// unifiedDiff returns the unified diff (diff -u) that turns a into b, with
// diffContext lines of context, headed by nameA and nameB, cut after max
// lines. It returns "" when a and b are equal.
func unifiedDiff(nameA, nameB string, a, b []byte, max int) string {
	x, y := splitLines(string(a)), splitLines(string(b))
	ops := diffLines(x, y)
	var out strings.Builder
	n := 0
	emit := func(s string) bool {
		if n == max {
			fmt.Fprintf(&out, "... (diff cut after %d lines)\n", max)
			n++
			return false
		}
		if n > max {
			return false
		}
		out.WriteString(s)
		n++
		return true
	}
	for i := 0; i < len(ops); {
		if ops[i].kind == ' ' {
			i++
			continue
		}
		// A hunk: from diffContext lines before this change to
		// diffContext lines after the last change that follows within
		// 2*diffContext unchanged lines.
		start := max0(i - diffContext)
		end := i
		for j := i; j < len(ops); j++ {
			if ops[j].kind != ' ' {
				end = j + 1
			} else if j-end >= 2*diffContext {
				break
			}
		}
		end = min(end+diffContext, len(ops))
		if out.Len() == 0 {
			out.WriteString("--- " + nameA + "\n+++ " + nameB + "\n")
		}
		var la, lb int
		for _, o := range ops[start:end] {
			if o.kind != '+' {
				la++
			}
			if o.kind != '-' {
				lb++
			}
		}
		if !emit(fmt.Sprintf("@@ -%s +%s @@\n", hunkRange(ops[start].a, la), hunkRange(ops[start].b, lb))) {
			break
		}
		for _, o := range ops[start:end] {
			line := string(o.kind) + o.text
			if !strings.HasSuffix(line, "\n") {
				line += "\n\\ No newline at end of file\n"
			}
			if !emit(line) {
				break
			}
		}
		i = end
	}
	return out.String()
}

// hunkRange is one side of a hunk header: the first line (from 1) and the
// count, or for an empty side the line before it.
func hunkRange(at, n int) string {
	if n == 0 {
		return fmt.Sprintf("%d,0", at)
	}
	if n == 1 {
		return fmt.Sprintf("%d", at+1)
	}
	return fmt.Sprintf("%d,%d", at+1, n)
}

func max0(i int) int { return max(i, 0) }

// splitLines splits s after each newline; the last line lacks one when s
// does not end in one.
func splitLines(s string) []string {
	var out []string
	for s != "" {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:i+1])
		s = s[i+1:]
	}
	return out
}

// diffOp is one line of a diff: kept (' '), removed ('-') or added ('+'),
// with its index in a and in b before it.
type diffOp struct {
	kind byte
	text string
	a, b int
}

// diffLines returns the line operations that turn x into y: the common
// head and tail kept, and between them a longest common subsequence kept
// (or, past maxDiffCells, everything removed and added).
func diffLines(x, y []string) []diffOp {
	head := 0
	for head < len(x) && head < len(y) && x[head] == y[head] {
		head++
	}
	tail := 0
	for tail < len(x)-head && tail < len(y)-head && x[len(x)-1-tail] == y[len(y)-1-tail] {
		tail++
	}
	mx, my := x[head:len(x)-tail], y[head:len(y)-tail]
	ops := make([]diffOp, 0, len(x)+len(y))
	a, b := 0, 0
	keep := func() { ops = append(ops, diffOp{' ', x[a], a, b}); a++; b++ }
	del := func() { ops = append(ops, diffOp{'-', x[a], a, b}); a++ }
	add := func() { ops = append(ops, diffOp{'+', y[b], a, b}); b++ }
	for range head {
		keep()
	}
	if (len(mx)+1)*(len(my)+1) > maxDiffCells {
		for range mx {
			del()
		}
		for range my {
			add()
		}
	} else {
		// lcs[i*w+j] is the length of a longest common subsequence of
		// mx[i:] and my[j:].
		w := len(my) + 1
		lcs := make([]int32, (len(mx)+1)*w)
		for i := len(mx) - 1; i >= 0; i-- {
			for j := len(my) - 1; j >= 0; j-- {
				if mx[i] == my[j] {
					lcs[i*w+j] = lcs[(i+1)*w+j+1] + 1
				} else {
					lcs[i*w+j] = max(lcs[(i+1)*w+j], lcs[i*w+j+1])
				}
			}
		}
		i, j := 0, 0
		for i < len(mx) || j < len(my) {
			switch {
			case i < len(mx) && j < len(my) && mx[i] == my[j]:
				keep()
				i++
				j++
			case j == len(my) || (i < len(mx) && lcs[(i+1)*w+j] >= lcs[i*w+j+1]):
				del()
				i++
			default:
				add()
				j++
			}
		}
	}
	for range tail {
		keep()
	}
	return ops
}
