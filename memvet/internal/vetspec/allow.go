package vetspec

import (
	"fmt"
	"go/ast"
	"go/token"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// AllowPrefix starts the escape comment. It must carry a reason:
//
//	//memvet:allow splitAccount routes a decommit's refund to the leases it covers
//
// and silences every memvet finding on its own line or on the line below.
const AllowPrefix = "//memvet:allow"

// Allow is one escape comment.
type Allow struct {
	Comment *ast.Comment
	Reason  string
}

// Allows returns the escape comments of f.
func Allows(f *ast.File) []Allow {
	var out []Allow
	for _, g := range f.Comments {
		for _, c := range g.List {
			if rest, ok := strings.CutPrefix(c.Text, AllowPrefix); ok && (rest == "" || rest[0] == ' ' || rest[0] == '\t') {
				out = append(out, Allow{Comment: c, Reason: strings.TrimSpace(rest)})
			}
		}
	}
	return out
}

// Reporter reports a pass's diagnostics unless an escape with a reason
// covers their line. An escape without a reason covers nothing (the allow
// analyzer reports it).
type Reporter struct {
	pass    *analysis.Pass
	allowed map[*token.File]map[int]bool
}

// NewReporter indexes the escapes of pass's files.
func NewReporter(pass *analysis.Pass) *Reporter {
	r := &Reporter{pass: pass, allowed: map[*token.File]map[int]bool{}}
	for _, f := range pass.Files {
		tf := pass.Fset.File(f.Pos())
		for _, a := range Allows(f) {
			if a.Reason == "" {
				continue
			}
			if r.allowed[tf] == nil {
				r.allowed[tf] = map[int]bool{}
			}
			line := tf.Line(a.Comment.Pos())
			r.allowed[tf][line] = true
			r.allowed[tf][line+1] = true
		}
	}
	return r
}

// Report reports d unless an escape covers the line it starts on.
func (r *Reporter) Report(d analysis.Diagnostic) {
	if tf := r.pass.Fset.File(d.Pos); tf != nil && r.allowed[tf][tf.Line(d.Pos)] {
		return
	}
	r.pass.Report(d)
}

// Reportf is Report of a diagnostic at [pos, end) with a formatted message.
func (r *Reporter) Reportf(n ast.Node, format string, args ...any) {
	r.Report(analysis.Diagnostic{Pos: n.Pos(), End: n.End(), Message: fmt.Sprintf(format, args...)})
}
