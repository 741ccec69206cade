package vetspec

import (
	"go/ast"
	"go/token"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/ctrlflow"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
	"golang.org/x/tools/go/cfg"
)

// FlowRequires is the Requires of an analyzer that walks Funcs.
var FlowRequires = []*analysis.Analyzer{inspect.Analyzer, ctrlflow.Analyzer}

// Funcs calls check with every function that has a body and a
// control-flow graph, declared or literal, in the files of pass that memvet
// checks (not Exempt). The analyzer must require FlowRequires.
func Funcs(pass *analysis.Pass, check func(fn ast.Node, g *cfg.CFG, body *ast.BlockStmt)) {
	exempt := map[*token.File]bool{}
	for _, f := range pass.Files {
		if Exempt(pass, f) {
			exempt[pass.Fset.File(f.Pos())] = true
		}
	}
	ins := pass.ResultOf[inspect.Analyzer].(*inspector.Inspector)
	cfgs := pass.ResultOf[ctrlflow.Analyzer].(*ctrlflow.CFGs)
	ins.Preorder([]ast.Node{(*ast.FuncDecl)(nil), (*ast.FuncLit)(nil)}, func(n ast.Node) {
		if exempt[pass.Fset.File(n.Pos())] {
			return
		}
		var g *cfg.CFG
		var body *ast.BlockStmt
		switch n := n.(type) {
		case *ast.FuncDecl:
			g, body = cfgs.FuncDecl(n), n.Body // nil, nil without a body
		case *ast.FuncLit:
			g, body = cfgs.FuncLit(n), n.Body
		}
		if g != nil {
			check(n, g, body)
		}
	})
}
