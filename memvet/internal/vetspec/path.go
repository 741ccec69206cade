package vetspec

import (
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/cfg"
)

// After returns the block of g that holds the node n and the nodes that
// follow n in it; a nil block when n is not in the graph (unreachable code).
func After(g *cfg.CFG, n ast.Node) (*cfg.Block, []ast.Node) {
	var def *cfg.Block
	var rest []ast.Node
	for _, b := range g.Blocks {
		for i, m := range b.Nodes {
			if m == n {
				def, rest = b, b.Nodes[i+1:]
			}
		}
	}
	return def, rest
}

// PathToReturn finds a path through g, from just after the node from to a
// return, on which done holds for no node. It returns the return statement
// ending the path (possibly synthetic), or nil when every path is done, when
// from is not in the graph, or when the function is too tangled to judge.
//
// The walk knows which error variables are nil along the path, starting
// from start: a branch on `x != nil` or `x == nil` that contradicts what the
// path knows is not taken, and an assignment to a variable (or taking its
// address) forgets what was known of it.
func PathToReturn(info *types.Info, g *cfg.CFG, from ast.Node, start Facts, done func(ast.Node) bool) *ast.ReturnStmt {
	def, rest := After(g, from)
	if def == nil {
		return nil // not in the graph (unreachable code)
	}
	seen := map[string]bool{}
	budget := 20000 // states; past it nothing is reported
	var walk func(b *cfg.Block, nodes []ast.Node, known Facts) *ast.ReturnStmt
	walk = func(b *cfg.Block, nodes []ast.Node, known Facts) *ast.ReturnStmt {
		for _, n := range nodes {
			if done(n) {
				return nil
			}
			known = known.Forget(info, n)
		}
		if ret := b.Return(); ret != nil {
			return ret
		}
		type edge struct {
			b     *cfg.Block
			known Facts
		}
		var next []edge
		for _, s := range b.Succs {
			next = append(next, edge{s, known})
		}
		if len(b.Succs) == 2 && len(b.Nodes) > 0 {
			if cond, ok := b.Nodes[len(b.Nodes)-1].(ast.Expr); ok {
				if v, branches := ErrBranches(info, cond); v != nil {
					next = next[:0]
					for i, s := range b.Succs {
						k := known
						if branches[i] != Unknown {
							branchNil := branches[i] == Nil
							if was, ok := known[v]; ok && was != branchNil {
								continue // contradicts the path
							}
							k = known.With(v, branchNil)
						}
						next = append(next, edge{s, k})
					}
				}
			}
		}
		for _, e := range next {
			key := e.known.Key(int(e.b.Index))
			if seen[key] {
				continue
			}
			seen[key] = true
			if budget--; budget < 0 {
				return nil
			}
			if ret := walk(e.b, e.b.Nodes, e.known); ret != nil {
				return ret
			}
		}
		return nil
	}
	return walk(def, rest, start)
}
