package handleclose

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"strings"

	"github.com/memgen/memgen/memvet/internal/vetspec"
	"golang.org/x/tools/go/analysis"
)

// deferFix suggests `defer v.Close()` when that is plainly right: the
// handle is defined by `:=` in a block, nothing in the function lets it go
// or closes it, and either no error comes with it or the statement after
// the definition is `if err != nil { ... return }`, after which the defer
// goes.
func deferFix(pass *analysis.Pass, body *ast.BlockStmt, hv handleVar) (analysis.SuggestedFix, bool) {
	as, ok := hv.stmt.(*ast.AssignStmt)
	if !ok || as.Tok.String() != ":=" || letsGo(pass.TypesInfo, body, hv, false) {
		return analysis.SuggestedFix{}, false
	}
	var list []ast.Stmt
	var at int
	ast.Inspect(body, func(n ast.Node) bool {
		if b, ok := n.(*ast.BlockStmt); ok {
			for i, s := range b.List {
				if s == as {
					list, at = b.List, i
				}
			}
		}
		return list == nil
	})
	if list == nil {
		return analysis.SuggestedFix{}, false
	}
	after := ast.Stmt(as)
	if hv.err != nil {
		if at+1 >= len(list) {
			return analysis.SuggestedFix{}, false
		}
		is, ok := list[at+1].(*ast.IfStmt)
		if !ok || is.Init != nil || is.Else != nil || !isErrNotNil(pass, is.Cond, hv.err) || !endsInReturn(is.Body) {
			return analysis.SuggestedFix{}, false
		}
		after = is
	}
	indent := strings.Repeat("\t", pass.Fset.Position(as.Pos()).Column-1)
	return analysis.SuggestedFix{
		Message: fmt.Sprintf("defer %s.%s()", hv.v.Name(), hv.h.Close),
		TextEdits: []analysis.TextEdit{{
			Pos: after.End(), End: after.End(),
			NewText: fmt.Appendf(nil, "\n%sdefer %s.%s()", indent, hv.v.Name(), hv.h.Close),
		}},
	}, true
}

func endsInReturn(b *ast.BlockStmt) bool {
	if len(b.List) == 0 {
		return false
	}
	_, ok := b.List[len(b.List)-1].(*ast.ReturnStmt)
	return ok
}

func isErrNotNil(pass *analysis.Pass, cond ast.Expr, err *types.Var) bool {
	v, op := vetspec.NilTest(pass.TypesInfo, cond)
	return v == err && op == token.NEQ
}
