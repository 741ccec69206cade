// Package pathtable measures the code paths of memgen's common operations:
// the distinct functions a call enters between its entry and its return,
// and the files they are in, counted from the coverage counters of a
// binary built with -cover. The counters are cleared just before the call
// and written just after it (runtime/coverage), so a function counts when
// any of its blocks ran during the call: functions entered, not stack
// depth. A function literal counts as a function of its own, named after
// the function that holds it.
//
// The package's test runs the operations over the real stack (the
// governor, the manager, the execution context, the checked wrapper and
// the CPU mechanism) and compares what it measures with the table in
// docs/pmm.md; `make path-table` runs it, and `make path-table-update`
// rewrites the table.
package pathtable

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Block is one line of a text coverage profile: a range of a file and how
// many times it ran.
type Block struct {
	File       string // the import path's file: module path, package, file name
	Start, End int    // lines
	StartCol   int
	Count      int
}

// ParseProfile reads a text coverage profile (go tool covdata textfmt, or
// go test -coverprofile).
func ParseProfile(r io.Reader) ([]Block, error) {
	var bs []Block
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "mode:") || line == "" {
			continue
		}
		// file:startLine.startCol,endLine.endCol numStmts count
		colon := strings.LastIndexByte(line, ':')
		if colon < 0 {
			return nil, fmt.Errorf("pathtable: bad profile line %q", line)
		}
		f := strings.Fields(line[colon+1:])
		if len(f) != 3 {
			return nil, fmt.Errorf("pathtable: bad profile line %q", line)
		}
		var sl, sc2, el, ec int
		if _, err := fmt.Sscanf(f[0], "%d.%d,%d.%d", &sl, &sc2, &el, &ec); err != nil {
			return nil, fmt.Errorf("pathtable: bad profile line %q: %w", line, err)
		}
		n, err := strconv.Atoi(f[2])
		if err != nil {
			return nil, fmt.Errorf("pathtable: bad profile line %q: %w", line, err)
		}
		bs = append(bs, Block{File: line[:colon], Start: sl, StartCol: sc2, End: el, Count: n})
	}
	return bs, sc.Err()
}

// Path is what one call entered: its functions ("pkg.Func",
// "pkg.(*T).Method", "pkg.Func.func1") and their files (relative to the
// module's root), sorted.
type Path struct {
	Functions []string
	Files     []string
	file      map[string]string // each function's file
}

// Measure maps the blocks that ran (Count > 0) to the functions that hold
// them. module is the module's path and root its directory: a profile's
// file github.com/memgen/memgen/pmm/binding.go is root/pmm/binding.go.
// Test files, and the files under the directories skip names (relative to
// root: the measuring program's own), are not counted.
func Measure(blocks []Block, module, root string, skip ...string) (Path, error) {
	funcs := map[string]bool{}
	files := map[string]bool{}
	file := map[string]string{}
	idx := map[string][]fn{}
	for _, b := range blocks {
		if b.Count == 0 || strings.HasSuffix(b.File, "_test.go") {
			continue
		}
		rel, ok := strings.CutPrefix(b.File, module+"/")
		if !ok {
			return Path{}, fmt.Errorf("pathtable: %s is outside module %s", b.File, module)
		}
		if skipped(rel, skip) {
			continue
		}
		fs, done := idx[rel]
		if !done {
			var err error
			if fs, err = functions(filepath.Join(root, rel)); err != nil {
				return Path{}, err
			}
			idx[rel] = fs
		}
		name := enclosing(fs, b.Start, b.StartCol)
		if name == "" {
			continue // a block outside any function (none in practice)
		}
		full := filepath.Dir(rel) + "." + name
		funcs[full] = true
		files[rel] = true
		file[full] = rel
	}
	return Path{Functions: sorted(funcs), Files: sorted(files), file: file}, nil
}

func skipped(rel string, skip []string) bool {
	for _, d := range skip {
		if strings.HasPrefix(rel, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}

// Common is what every one of paths entered: the functions in all of
// them, and the files those are in.
func Common(paths ...Path) Path {
	if len(paths) == 0 {
		return Path{}
	}
	count := map[string]int{}
	for _, p := range paths {
		for _, f := range p.Functions {
			count[f]++
		}
	}
	funcs, files := map[string]bool{}, map[string]bool{}
	for _, f := range paths[0].Functions {
		if count[f] == len(paths) {
			funcs[f] = true
			files[paths[0].file[f]] = true
		}
	}
	out := Path{Functions: sorted(funcs), Files: sorted(files), file: map[string]string{}}
	for f := range funcs {
		out.file[f] = paths[0].file[f]
	}
	return out
}

// fn is a function's span in a file and its name.
type fn struct {
	name       string
	start, end token.Position
	depth      int // a literal inside a function is deeper
}

// functions lists the functions and function literals of a file.
func functions(path string) ([]fn, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, fmt.Errorf("pathtable: %w", err)
	}
	var fs []fn
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		name := fd.Name.Name
		if fd.Recv != nil && len(fd.Recv.List) == 1 {
			name = recvName(fd.Recv.List[0].Type) + "." + name
		}
		fs = append(fs, fn{name: name, start: fset.Position(fd.Pos()), end: fset.Position(fd.End())})
		lits := 0
		var walk func(n ast.Node, outer string, depth int)
		walk = func(n ast.Node, outer string, depth int) {
			ast.Inspect(n, func(x ast.Node) bool {
				if lit, ok := x.(*ast.FuncLit); ok && x != n {
					lits++
					lname := fmt.Sprintf("%s.func%d", outer, lits)
					fs = append(fs, fn{name: lname, start: fset.Position(lit.Pos()), end: fset.Position(lit.End()), depth: depth})
					walk(lit, lname, depth+1)
					return false
				}
				return true
			})
		}
		walk(fd.Body, name, 1)
	}
	return fs, nil
}

func recvName(t ast.Expr) string {
	switch x := t.(type) {
	case *ast.StarExpr:
		return "(*" + recvName(x.X) + ")"
	case *ast.IndexExpr:
		return recvName(x.X)
	case *ast.IndexListExpr:
		return recvName(x.X)
	case *ast.Ident:
		return x.Name
	}
	return "?"
}

// enclosing names the innermost function whose span holds line:col.
func enclosing(fs []fn, line, col int) string {
	best, depth := "", -1
	for _, f := range fs {
		if before(line, col, f.start) || !before(line, col, f.end) {
			continue
		}
		if f.depth > depth {
			best, depth = f.name, f.depth
		}
	}
	return best
}

// before reports whether line:col comes before p.
func before(line, col int, p token.Position) bool {
	return line < p.Line || line == p.Line && col < p.Column
}

func sorted(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Part returns what of p is in the files for which in is true.
func (p Path) Part(in func(file string) bool) Path {
	funcs, files := map[string]bool{}, map[string]bool{}
	out := Path{file: map[string]string{}}
	for _, f := range p.Functions {
		if file := p.file[f]; in(file) {
			funcs[f], files[file] = true, true
			out.file[f] = file
		}
	}
	out.Functions, out.Files = sorted(funcs), sorted(files)
	return out
}

// Mechanism reports whether file is a mechanism's (under mechanisms/): the
// code a path reaches, not the code it crosses to get there.
func Mechanism(file string) bool { return strings.HasPrefix(file, "mechanisms/") }

// Table is the markdown table of the measured paths, one row per path in
// the given order: the path's name; the functions and files of memgen's
// layers it entered on its way to the mechanism and back (everything but
// the mechanism's own code: pmm, the governor, the execution context, the
// checked wrapper, memapi, the pool); the mechanism's own; and the goal,
// when goals names one.
func Table(names []string, paths map[string]Path, goals map[string]string) string {
	var b strings.Builder
	b.WriteString("| path | functions entered | files | the mechanism's own: functions, files | goal |\n| --- | --- | --- | --- | --- |\n")
	for _, n := range names {
		p := paths[n]
		layers := p.Part(func(f string) bool { return !Mechanism(f) })
		mech := p.Part(Mechanism)
		goal := goals[n]
		if goal == "" {
			goal = "—"
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d, %d | %s |\n", n, len(layers.Functions), len(layers.Files), len(mech.Functions), len(mech.Files), goal)
	}
	return b.String()
}

// Replace returns doc with the text between the lines begin and end
// (excluded) replaced by body; it fails when either line is missing.
func Replace(doc, begin, end, body string) (string, error) {
	i := strings.Index(doc, begin+"\n")
	if i < 0 {
		return "", fmt.Errorf("pathtable: %q not found", begin)
	}
	i += len(begin) + 1
	j := strings.Index(doc[i:], end)
	if j < 0 {
		return "", fmt.Errorf("pathtable: %q not found after %q", end, begin)
	}
	return doc[:i] + body + doc[i+j:], nil
}

// ModuleRoot finds the directory of the go.mod above dir.
func ModuleRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("pathtable: no go.mod above %s", dir)
		}
	}
}
