package gen

import (
	"bytes"
	"errors"
	"fmt"
	"go/format"
	"go/scanner"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/dave/jennifer/jen"
)

// Config says where generation happens.
type Config struct {
	Module string // module path, e.g. github.com/memgen/memgen
	// Root is the module's directory. Emitters consult it only to see which
	// hand-written mechanism packages exist (their glue is generated when they
	// do); nil-safe: an empty Root means none exist.
	Root string
	// Spec is the spec file's path relative to the module root, slash
	// separated, as memgen was told it (memgen's -spec flag, which go
	// generate leaves at spec/capabilities.yaml). Every generated file's
	// header names it. Empty means the name the spec was loaded under
	// (Spec.File).
	Spec string
}

// generator is the state of one generation run: the spec, the config, the
// files produced so far with the emitter that wrote each, and the results of
// the emitters that ran.
type generator struct {
	Spec    *Spec
	Config  Config
	jfiles  map[string]*jen.File
	raw     map[string][]byte
	owner   map[string]string // module-relative path -> the emitter that wrote it
	current *emitter          // the emitter running now
	results map[*emitter]any
	errs    errs
}

// Errorf records a generation error at a spec position without stopping the
// emitter: Generate reports every error of a run together.
func (g *generator) Errorf(p pos, format string, args ...any) { g.errs.add(p, format, args...) }

// emitterName names the running emitter, for headers and messages.
func (g *generator) emitterName() string {
	if g.current == nil {
		return "none"
	}
	return g.current.Name
}

// specPath is the spec's module-relative path, as headers name it.
func (g *generator) specPath() string { return g.Config.specPath(g.Spec) }

func (c Config) specPath(s *Spec) string {
	if c.Spec != "" {
		return c.Spec
	}
	return s.File
}

// header returns the first line of a Go or C file the running emitter
// writes; template is the module-relative path of the template the file is
// copied from, or empty.
func (g *generator) header(template string) string {
	return goHeader(g.specPath(), g.emitterName(), template)
}

// claim records that the running emitter writes rel. Each file has one
// emitter: a path another emitter already wrote, or one written whole
// (Raw) twice, is an error of the run.
func (g *generator) claim(rel string, whole bool) bool {
	name := g.emitterName()
	prev, ok := g.owner[rel]
	switch {
	case !ok:
		g.owner[rel] = name
		return true
	case prev != name:
		g.Errorf(pos{g.Spec.File, 1, 1}, "emitters %s and %s both write %s: a generated file has one emitter", prev, name, rel)
	case whole || g.jfiles[rel] == nil:
		g.Errorf(pos{g.Spec.File, 1, 1}, "emitter %s writes %s twice", name, rel)
	default:
		return true // the same emitter adding to its own jennifer file
	}
	return false
}

// File returns the jennifer file for a module-relative path, creating it in
// package pkg (the last path element of its directory unless given) with
// the running emitter's header. An emitter may ask for its own file again;
// a file of another emitter is an error (the file returned is then
// discarded).
func (g *generator) File(rel, pkg string) *jen.File {
	dir := path.Dir(rel)
	if pkg == "" {
		pkg = path.Base(dir)
	}
	if !g.claim(rel, false) {
		return jen.NewFilePathName(g.Config.Module+"/"+dir, pkg)
	}
	if f, ok := g.jfiles[rel]; ok {
		return f
	}
	f := jen.NewFilePathName(g.Config.Module+"/"+dir, pkg)
	f.HeaderComment(g.header(""))
	g.jfiles[rel] = f
	return f
}

// Raw adds a file produced without jennifer (docs, data, rendered
// templates). It must carry the header itself (g.header).
func (g *generator) Raw(rel string, data []byte) {
	if g.claim(rel, true) {
		g.raw[rel] = data
	}
}

// Import returns the import path of a module-relative package directory.
func (g *generator) Import(dir string) string { return g.Config.Module + "/" + dir }

// Contract returns the import path of the contract package.
func (g *generator) Contract() string { return g.Import(g.Spec.Packages.Contract) }

func newGen(s *Spec, cfg Config) *generator {
	return &generator{Spec: s, Config: cfg, jfiles: map[string]*jen.File{}, raw: map[string][]byte{},
		owner: map[string]string{}, results: map[*emitter]any{}}
}

// Generate runs every emitter, each after those it requires (see
// emitterOrder), and returns the files it produced, keyed by
// module-relative slash path, gofmt-clean with goimports-grouped imports. On
// failure the error is an ErrorList holding every problem of the run, each at
// a spec position: emitters do not stop at the first, and a file that does
// not format is reported with a short excerpt, never as a source dump.
func Generate(s *Spec, cfg Config) (map[string][]byte, error) {
	g := newGen(s, cfg)
	g.run(emitters)
	if len(g.errs.list) > 0 {
		// A failed emitter leaves its files half-built; formatting them
		// would only add consequences to the report.
		return nil, g.errs.list.sorted()
	}
	out := g.render()
	if len(g.errs.list) > 0 {
		return nil, g.errs.list.sorted()
	}
	return out, nil
}

// render formats every file, recording the ones that do not format.
func (g *generator) render() map[string][]byte {
	out := make(map[string][]byte, len(g.jfiles)+len(g.raw))
	for _, rel := range sortedFiles(g.jfiles) {
		f := g.jfiles[rel]
		f.NoFormat = true // formatted below, so that a failure is reported briefly
		var buf bytes.Buffer
		if err := f.Render(&buf); err != nil {
			g.Errorf(pos{g.Spec.File, 1, 1}, "render %s: %v", rel, err)
			continue
		}
		src, err := format.Source(buf.Bytes())
		if err != nil {
			g.formatError(rel, buf.Bytes(), err)
			continue
		}
		out[rel] = spaceDecls(groupImports(src))
	}
	for rel, b := range g.raw {
		if strings.HasSuffix(rel, ".go") {
			b = groupImports(b)
		}
		out[rel] = b
	}
	return out
}

func sortedFiles(m map[string]*jen.File) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// posPrefix matches an error message that starts with a spec position.
var posPrefix = regexp.MustCompile(`^(.+?):(\d+):(\d+): (.*)$`)

// emitError records what an emitter returned: an ErrorList or SpecError as
// it is, a message that starts with a spec position at that position, and
// anything else at the top of the spec, naming the emitter.
func (g *generator) emitError(name string, err error) {
	var list ErrorList
	var one *specError
	switch {
	case errors.As(err, &list):
		g.errs.list = append(g.errs.list, list...)
	case errors.As(err, &one):
		g.errs.list = append(g.errs.list, one)
	default:
		msg := err.Error()
		if m := posPrefix.FindStringSubmatch(msg); m != nil && m[1] == g.Spec.File {
			line, _ := strconv.Atoi(m[2])
			col, _ := strconv.Atoi(m[3])
			g.Errorf(pos{g.Spec.File, line, col}, "%s: %s", name, m[4])
			return
		}
		g.Errorf(pos{g.Spec.File, 1, 1}, "%s: %s", name, msg)
	}
}

// formatError reports generated source that does not parse: the generated
// file and line, a few lines around it, and the spec declaration the
// offending line names (its first identifier the spec declares), so that the
// report points at the spec rather than dumping the source.
func (g *generator) formatError(rel string, src []byte, err error) {
	line, col, msg := 1, 1, err.Error()
	var list scanner.ErrorList
	if errors.As(err, &list) && len(list) > 0 {
		line, col, msg = list[0].Pos.Line, list[0].Pos.Column, list[0].Msg
	}
	lines := strings.Split(string(src), "\n")
	var ex strings.Builder
	for i := max(line-2, 1); i <= min(line+2, len(lines)); i++ {
		l := strings.TrimSpace(lines[i-1])
		if len(l) > 100 {
			l = l[:100] + "..."
		}
		mark := "  "
		if i == line {
			mark = "> "
		}
		fmt.Fprintf(&ex, "\n\t%s%d: %s", mark, i, l)
	}
	culprit := ""
	if line <= len(lines) {
		culprit = lines[line-1]
	}
	p, what := g.blame(culprit)
	g.Errorf(p, "generated %s:%d:%d does not compile: %s (%s; the validator should have caught this: please report it)%s", rel, line, col, msg, what, ex.String())
}

var identToken = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)

// blame finds the spec declaration a generated line most likely comes from:
// the first identifier on it that names a declared type, interface,
// capability, method or parameter.
func (g *generator) blame(line string) (pos, string) {
	s := g.Spec
	decl := map[string]pos{}
	add := func(n string, p pos) {
		if _, ok := decl[n]; !ok && n != "" {
			decl[n] = p
		}
	}
	for _, t := range s.Types {
		add(t.Name, t.Pos)
		for _, f := range t.Fields {
			add(f.Name, f.Pos)
			add(fieldName(f.Name), f.Pos)
		}
	}
	for _, c := range s.Capabilities {
		add(c.Name, c.Pos)
	}
	for _, i := range s.Interfaces {
		add(i.Name, i.Pos)
	}
	methods := func(ms []*method) {
		for _, m := range ms {
			add(m.Name, m.Pos)
			for _, p := range m.Params {
				add(p.Name, p.NamePos)
			}
		}
	}
	for _, c := range s.Capabilities {
		methods(c.Methods)
	}
	for _, i := range s.Interfaces {
		methods(i.Methods)
	}
	for _, id := range identToken.FindAllString(line, -1) {
		if p, ok := decl[id]; ok {
			return p, "the line names " + id
		}
	}
	return pos{s.File, 1, 1}, "no spec name on the line"
}

// PackageWritten reports whether the hand-written package of m is there,
// under the module directory root: a directory holding at least one Go file
// that memgen did not write.
func (m *Mechanism) PackageWritten(root string) bool {
	if root == "" {
		return false
	}
	ents, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(m.Package)))
	if err != nil {
		return false
	}
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") || strings.HasPrefix(n, "zz_generated") {
			continue
		}
		return true
	}
	return false
}

// spaceDecls puts a blank line after every top-level declaration that ends
// with a closing "}" or ")" directly followed by another one, as a person
// writes Go. The input is gofmt-formatted, so top-level lines are exactly the
// unindented ones, and the result is still gofmt-formatted.
func spaceDecls(src []byte) []byte {
	lines := bytes.SplitAfter(src, []byte("\n"))
	out := make([]byte, 0, len(src)+len(src)/16)
	for i, l := range lines {
		out = append(out, l...)
		t := bytes.TrimRight(l, "\n")
		if (len(t) == 1 && (t[0] == '}' || t[0] == ')')) && i+1 < len(lines) {
			n := lines[i+1]
			if len(n) > 0 && n[0] != '\n' && n[0] != '\t' && n[0] != ' ' && n[0] != '}' && n[0] != ')' {
				out = append(out, '\n')
			}
		}
	}
	return out
}
