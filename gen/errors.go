package gen

import (
	"fmt"
	"sort"
	"strings"
)

// specError is one problem in the spec, with the position it was found at.
type specError struct {
	Pos pos
	Msg string
}

func (e *specError) Error() string { return e.Pos.String() + ": " + e.Msg }

// ErrorList is every problem found in one load, sorted by position. It is
// returned as a whole so that a user fixes a spec in one pass.
type ErrorList []*specError

func (l ErrorList) Error() string {
	lines := make([]string, len(l))
	for i, e := range l {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

func (l ErrorList) sorted() ErrorList {
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i].Pos, l[j].Pos
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		if a.Col != b.Col {
			return a.Col < b.Col
		}
		return l[i].Msg < l[j].Msg
	})
	// Drop exact duplicates (the same fault reached twice).
	out := l[:0]
	for i, e := range l {
		if i > 0 && e.Pos == l[i-1].Pos && e.Msg == l[i-1].Msg {
			continue
		}
		out = append(out, e)
	}
	return out
}

type errs struct{ list ErrorList }

func (e *errs) add(p pos, format string, args ...any) {
	e.list = append(e.list, &specError{Pos: p, Msg: fmt.Sprintf(format, args...)})
}
