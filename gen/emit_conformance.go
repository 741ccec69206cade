package gen

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path"
	"sort"
	"strings"

	. "github.com/dave/jennifer/jen"
)

// conformanceEmitter writes the conformance suite's package.
var conformanceEmitter = &emitter{Name: "conformance", Requires: []*emitter{contractEmitter}, Emit: noResult(emitConformance)}

func init() { register(conformanceEmitter) }

// The conformance suite is part static, part derived from the spec.
//
// conformancetmpl/*.go hold the static part: the harness (T, Run, RunT,
// the per-subtest environment, the suite's own grant and account, the
// helpers that read and write memory through the device context), one
// fixture per method (valid<Method>: the arguments of one valid call), one
// witness per consuming method (witness<Method>: the check, through the
// device context, that the call did its work) and the hand-written
// scenarios. Each template has a "// memgen:needs ..." line naming the
// declarations it uses; a template is emitted only when the spec
// declares them all, so smaller specs get a smaller suite.
//
// This file derives the rest from the spec: one call type per method (its
// parameters as fields; do calls the method and tracks created handles),
// the snapshot of every query over every handle, how each handle type is
// released, and the rule subtests: per method, from its accounting effect,
// what it creates and releases, and its requires clauses; per optional
// capability, absence and no-silent-noop; per invariant whose applies_to
// names methods, the subtests that check it.

func emitConformance(g *generator) error {
	if g.Spec.Packages.Conformance == "" {
		return nil
	}
	seen := map[string]*method{}
	for _, c := range g.Spec.Capabilities {
		for _, m := range c.Methods {
			if prev := seen[m.Name]; prev != nil {
				return fmt.Errorf("conformance: %s.%s (%s) and %s.%s (%s) share a name; the suite needs method names unique across capabilities", prev.Owner, prev.Name, prev.Pos, m.Owner, m.Name, m.Pos)
			}
			seen[m.Name] = m
		}
	}
	fixtures, witnesses, err := g.conformanceStatic()
	if err != nil {
		return err
	}
	cg := &confGen{g: g, fixtures: fixtures, witnesses: witnesses, used: map[string]*method{}, names: map[string]bool{}}
	if err := cg.emitCalls(); err != nil {
		return err
	}
	if err := cg.emitRules(); err != nil {
		return err
	}
	var missing []string
	for name, m := range cg.used {
		if !fixtures[name] {
			missing = append(missing, fmt.Sprintf("%s.%s (declared at %s)", m.Owner, m.Name, m.Pos))
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("conformance: no fixture (func (e *env) valid<Method>(t T) in gen/conformancetmpl) for %s", strings.Join(missing, ", "))
	}
	for _, m := range cg.unwitnessed {
		missing = append(missing, fmt.Sprintf("%s.%s (declared at %s)", m.Owner, m.Name, m.Pos))
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("conformance: no witness (func (e *env) witness<Method>(t T, c *call<Method>) func(memapi.Handle) in gen/conformancetmpl) for the consuming method %s", strings.Join(missing, ", "))
	}
	return nil
}

// conformanceStatic emits the templates whose needs the spec meets and
// returns the methods they provide fixtures and witnesses for. The templates
// are rendered by the machinery of template.go (a "// memgen:needs ..." line
// naming what the template uses: capabilities, Capability.Method, types,
// enum values, errors), and the fixtures (func (e *env) valid<Method>(t T) *call<Method>) and
// witnesses (func (e *env) witness<Method>(t T, c *call<Method>)
// func(memapi.Handle)) found in the syntax tree, not by matching text.
func (g *generator) conformanceStatic() (fixtures, witnesses map[string]bool, err error) {
	tmpls, err := g.renderTemplates(templates, "conformancetmpl/*.go", path.Base(g.Spec.Packages.Conformance))
	if err != nil {
		return nil, nil, err
	}
	fixtures, witnesses = map[string]bool{}, map[string]bool{}
	for _, t := range tmpls {
		file, err := parser.ParseFile(token.NewFileSet(), t.name, t.src, parser.SkipObjectResolution)
		if err != nil {
			return nil, nil, err
		}
		for _, d := range file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || !isEnvMethod(fd) {
				continue
			}
			name := fd.Name.Name
			switch params := fd.Type.Params.List; {
			case strings.HasPrefix(name, "valid") && len(params) == 1:
				fixtures[strings.TrimPrefix(name, "valid")] = true
			case strings.HasPrefix(name, "witness") && len(params) == 2 && fd.Type.Results != nil:
				witnesses[strings.TrimPrefix(name, "witness")] = true
			}
		}
		g.Raw(path.Join(g.Spec.Packages.Conformance, t.name), t.src)
	}
	return fixtures, witnesses, nil
}

// isEnvMethod reports whether fd is a method of *env.
func isEnvMethod(fd *ast.FuncDecl) bool {
	if fd.Recv == nil || len(fd.Recv.List) != 1 {
		return false
	}
	st, ok := fd.Recv.List[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	id, ok := st.X.(*ast.Ident)
	return ok && id.Name == "env"
}

type confGen struct {
	g           *generator
	fixtures    map[string]bool
	witnesses   map[string]bool    // methods with a witness<Method> in the templates
	unwitnessed []*method          // consuming methods without one
	used        map[string]*method // fixtures the rules call
	names       map[string]bool
	order       []string // subtest names in specTests order
	tests       []Code   // entries of specTests
	funcs       *File
}

func (cg *confGen) file(name string) *File {
	return cg.g.File(cg.g.Spec.Packages.Conformance+"/"+name, "conformance")
}

// capField is the env field holding an optional capability.
func capField(c *capability) string { return lowerFirst(c.Name) }

// capOf returns the capability declaring m.
func (cg *confGen) capOf(m *method) *capability { return cg.g.Spec.Capability(m.Owner) }

// creatorCap is the capability whose method creates handle type h.
func (cg *confGen) creatorCap(h string) *capability {
	for _, c := range cg.g.Spec.Capabilities {
		for _, m := range c.Methods {
			if m.Creates == h {
				return c
			}
		}
	}
	return nil
}

// needs is what a subtest of c needs: c and the capabilities that create the
// handles its methods take, transitively (views live in reservations).
func (cg *confGen) needs(c *capability) Code {
	s := cg.g.Spec
	set := map[string]bool{c.Name: true}
	seenType := map[string]bool{}
	var visitType func(t string)
	var visitCap func(c *capability)
	visitType = func(t string) {
		td := s.Type(t)
		if td == nil || td.Kind != KindHandle || seenType[t] {
			return
		}
		seenType[t] = true
		if cc := cg.creatorCap(t); cc != nil && !set[cc.Name] {
			set[cc.Name] = true
			visitCap(cc)
		}
		for _, f := range td.Fields {
			visitType(f.Type)
		}
	}
	visitCap = func(c *capability) {
		for _, m := range c.Methods {
			for _, p := range m.Params {
				visitType(p.Type)
			}
		}
	}
	visitCap(c)
	var args []Code
	for _, x := range s.Capabilities {
		if set[x.Name] {
			args = append(args, cg.g.C(capConst(x)))
		}
	}
	return cg.g.C(contractOf).Call(args...)
}

// recv returns the code reaching m's capability from env e.
func (cg *confGen) recv(m *method) *Statement {
	c := cg.capOf(m)
	if c.Required {
		return Id("e").Dot("m")
	}
	return Id("e").Dot(capField(c))
}

// conformanceLocals are the names of the suite's call methods; a spec
// parameter with one of these names would clash with them. The validator
// rejects them (badParamName); the check in the emitter is its backstop.
var conformanceLocals = []string{"call", "do"}

func callType(m *method) string { return "call" + m.Name }

// emitCalls writes calls.go: the capabilities the env holds, one call type
// per method, and what the spec's handle types need at run time.
func (cg *confGen) emitCalls() error {
	s := cg.g.Spec
	f := cg.file("calls.go")
	cg.emitCapabilityFields(f)
	for _, c := range s.Capabilities {
		for _, m := range c.Methods {
			for _, p := range m.Params {
				if contains(conformanceLocals, p.Name) {
					return fmt.Errorf("conformance: %s.%s: parameter name %q clashes with the suite's call methods", c.Name, m.Name, p.Name)
				}
			}
			cg.emitCall(f, c, m)
		}
	}
	cg.emitHandleFields(f)
	cg.emitReleaseHandle(f)
	cg.emitCommitted(f)
	cg.emitObserveQueries(f)
	return nil
}

// emitCapabilityFields writes the capabilities the env holds, one field per
// optional capability, and load, which fills them from the accessors.
func (cg *confGen) emitCapabilityFields(f *File) {
	g, s := cg.g, cg.g.Spec
	comment(f, "capabilities holds the optional capabilities the subject offers.")
	f.Type().Id("capabilities").StructFunc(func(st *Group) {
		for _, c := range s.Capabilities {
			if !c.Required {
				st.Id(capField(c)).Add(g.C(c.Name))
			}
		}
	})
	comment(f, "load asks m's accessors and returns the capabilities it claims.")
	f.Func().Params(Id("c").Op("*").Id("capabilities")).Id("load").Params(Id("m").Add(g.C(contractMechanism))).Add(g.C(contractCapSet)).BlockFunc(func(b *Group) {
		var req []Code
		for _, c := range s.Capabilities {
			if c.Required {
				req = append(req, g.C(capConst(c)))
			}
		}
		b.Id("s").Op(":=").Add(g.C(contractOf)).Call(req...)
		for _, c := range s.Capabilities {
			if c.Required {
				continue
			}
			b.If(List(Id("v"), Id("ok")).Op(":=").Id("m").Dot(accessor(c)).Call(), Id("ok")).Block(
				Id("c").Dot(capField(c)).Op("=").Id("v"),
				Id("s").Op("|=").Add(g.C(contractOf)).Call(g.C(capConst(c))),
			)
		}
		b.Return(Id("s"))
	})
}

// emitHandleFields writes handleFields: the handles a handle refers to.
func (cg *confGen) emitHandleFields(f *File) {
	g, s := cg.g, cg.g.Spec
	// handleFields: the handles a handle refers to.
	comment(f, "handleFields returns the live-or-not handles h refers to (a view's\nreservation and backing).")
	var fieldCases []Code
	for _, t := range s.handles() {
		var body []Code
		for _, fd := range t.Fields {
			if g.IsHandle(fd.Type) {
				body = append(body, If(Id("x").Op(":=").Id("h").Dot(fd.Name).Call(), Id("x").Op("!=").Nil()).Block(
					Id("out").Op("=").Append(Id("out"), Id("x")),
				))
			}
		}
		if len(body) > 0 {
			fieldCases = append(fieldCases, Case(Op("*").Add(g.C(t.Name))).Block(body...))
		}
	}
	f.Func().Id("handleFields").Params(Id("h").Add(g.C(contractHandle))).Index().Add(g.C(contractHandle)).BlockFunc(func(b *Group) {
		if len(fieldCases) == 0 {
			b.Return(Nil())
			return
		}
		b.Var().Id("out").Index().Add(g.C(contractHandle))
		b.Switch(Id("h").Op(":=").Id("h").Assert(Type())).Block(fieldCases...)
		b.Return(Id("out"))
	})
}

// emitReleaseHandle writes releaseHandle: how the sweep releases each
// handle type.
func (cg *confGen) emitReleaseHandle(f *File) {
	g, s := cg.g, cg.g.Spec
	// releaseHandle: how the sweep releases each handle type.
	comment(f, "releaseHandle releases h through e's mechanism with the method the spec\ndeclares for its type.")
	f.Func().Params(Id("e").Op("*").Id("env")).Id("releaseHandle").Params(Id("h").Add(g.C(contractHandle))).Error().BlockFunc(func(b *Group) {
		b.Switch(Id("h").Op(":=").Id("h").Assert(Type())).BlockFunc(func(sw *Group) {
			for _, t := range s.handles() {
				m := cg.releaser(t.Name)
				if m == nil {
					continue
				}
				vals := Dict{}
				for _, p := range m.Params {
					switch {
					case p.Name == m.Releases:
						vals[Id(p.Name)] = Id("h")
					case p.Type == "context.Context":
						vals[Id(p.Name)] = Id("e").Dot("ctx")
					case cg.isRole(p.Type, roleAccount):
						vals[Id(p.Name)] = Id("e").Dot("account")
					case cg.isRole(p.Type, roleGrant):
						vals[Id(p.Name)] = Id("e").Dot("grant")
					}
				}
				sw.Case(Op("*").Add(g.C(t.Name))).Block(
					List(Id("_"), Err()).Op(":=").Parens(Op("&").Id(callType(m)).Values(vals)).Dot("call").Call(Id("e")),
					Return(Err()),
				)
			}
		})
		b.Return(Qual("fmt", "Errorf").Call(Lit("the spec declares no method that releases %T"), Id("h")))
	})
}

// emitCommitted writes committed<Type>, the committed(x) function of
// accounting amounts, for each handle type that has a committed-bytes query.
func (cg *confGen) emitCommitted(f *File) {
	g, s := cg.g, cg.g.Spec
	// committed<Type>: the committed(x) function of accounting amounts.
	for _, t := range s.handles() {
		q := committedQuery(s, t.Name)
		if q == nil {
			continue
		}
		comment(f, fmt.Sprintf("committed%s returns %s(h); it must work.", t.Name, q.Name))
		f.Func().Params(Id("e").Op("*").Id("env")).Id("committed"+t.Name).Params(Id("t").Id("T"), Id("h").Op("*").Add(g.C(t.Name))).Add(g.C("Bytes")).Block(
			Id("t").Dot("Helper").Call(),
			List(Id("n"), Err()).Op(":=").Parens(Op("&").Id(callType(q)).Values(Dict{Id(q.Params[0].Name): Id("h")})).Dot("do").Call(Id("e")),
			If(Err().Op("!=").Nil()).Block(Id("t").Dot("Fatalf").Call(Lit(q.Name+"(%v): %v"), Id("h"), Err())),
			Return(Id("n")),
		)
	}
}

// emitObserveQueries writes observeQueries: every query of the spec over
// what it can be asked about.
func (cg *confGen) emitObserveQueries(f *File) {
	g, s := cg.g, cg.g.Spec
	comment(f, "observeQueries records the answer of every query method of the spec, for\nthe mechanism and for every live handle a query takes.")
	f.Func().Params(Id("e").Op("*").Id("env")).Id("observeQueries").Params(Id("prefix").String(), Id("s").Id("state"), Id("hs").Index().Add(g.C(contractHandle))).BlockFunc(func(b *Group) {
		var perHandle []Code
		for _, c := range s.Capabilities {
			for _, m := range c.Methods {
				if m.Accounting.Effect != effectQuery || len(m.Returns) == 0 {
					continue
				}
				var rs []Code
				for i := range m.Returns {
					rs = append(rs, Id(fmt.Sprintf("r%d", i)))
				}
				switch {
				case len(m.Params) == 0:
					call := List(rs...).Op(":=").Add(cg.recv(m)).Dot(m.Name).Call()
					rec := Id("s").Index(Id("prefix").Op("+").Lit(m.Name+"()")).Op("=").Qual("fmt", "Sprint").Call(rs...)
					if c.Required {
						b.Block(call, rec)
					} else {
						b.If(cg.recv(m).Op("!=").Nil()).Block(call, rec)
					}
				case len(m.Params) == 1 && g.IsHandle(m.Params[0].Type):
					body := []Code{
						List(rs...).Op(":=").Add(cg.recv(m)).Dot(m.Name).Call(Id("h")),
						Id("s").Index(Id("prefix").Op("+").Qual("fmt", "Sprintf").Call(Lit(m.Name+"(%v)"), Id("h"))).Op("=").Qual("fmt", "Sprint").Call(rs...),
					}
					if !c.Required {
						body = []Code{If(cg.recv(m).Op("!=").Nil()).Block(body...)}
					}
					perHandle = append(perHandle, Case(Op("*").Add(g.C(m.Params[0].Type))).Block(body...))
				}
			}
		}
		if len(perHandle) > 0 {
			b.For(List(Id("_"), Id("x")).Op(":=").Range().Id("hs")).Block(
				If(Op("!").Id("x").Dot("Live").Call()).Block(Continue()),
				Switch(Id("h").Op(":=").Id("x").Assert(Type())).Block(perHandle...),
			)
		}
	})
}

// releaser returns the method that releases handle type t with nothing but
// a context, the handle and the ledger: the sweep's way to release it.
func (cg *confGen) releaser(t string) *method {
	var best *method
	for _, c := range cg.g.Spec.Capabilities {
		for _, m := range c.Methods {
			if m.Releases == "" || m.Param(m.Releases).Type != t || m.Creates != "" {
				continue
			}
			simple := true
			for _, p := range m.Params {
				if p.Name != m.Releases && p.Type != "context.Context" && !cg.isRole(p.Type, roleAccount) && !cg.isRole(p.Type, roleGrant) {
					simple = false
				}
			}
			if simple && best == nil {
				best = m
			}
		}
	}
	return best
}

func (cg *confGen) isRole(typ, role string) bool {
	i := cg.g.Spec.interfaceNamed(typ)
	return i != nil && i.Role == role
}

// emitCall writes the call type of one method.
func (cg *confGen) emitCall(f *File, c *capability, m *method) {
	g := cg.g
	ct := callType(m)
	comment(f, fmt.Sprintf("%s holds the arguments of one %s.%s call.", ct, c.Name, m.Name))
	f.Type().Id(ct).StructFunc(func(st *Group) {
		for _, p := range m.Params {
			st.Id(p.Name).Add(g.Type(p.Type))
		}
	})
	var args []Code
	ctxParam := ""
	for _, p := range m.Params {
		if p.Type == "context.Context" && ctxParam == "" {
			// The call runs under its own deadline (env.op), never the
			// subtest's: a deadline bounds one operation.
			ctxParam = p.Name
			args = append(args, Id("ctx"))
			continue
		}
		args = append(args, Id("c").Dot(p.Name))
	}
	_, results := g.Signature(m)
	var rs []Code
	for i := range m.Returns {
		rs = append(rs, Id(fmt.Sprintf("r%d", i)))
	}
	errIdx := -1
	if m.ReturnsError() {
		errIdx = len(m.Returns) - 1
	}
	created := -1
	for i, r := range m.Returns {
		if m.Creates != "" && r.Type == m.Creates {
			created = i
		}
	}
	doc := "do calls " + m.Name + " on e's mechanism"
	if created >= 0 {
		doc += " and tracks the handle it creates"
	}
	comment(f, doc+".")
	f.Func().Params(Id("c").Op("*").Id(ct)).Id("do").Params(Id("e").Op("*").Id("env")).Params(results...).BlockFunc(func(b *Group) {
		if !c.Required {
			var zeros []Code
			for i, r := range m.Returns {
				if i == errIdx {
					zeros = append(zeros, Op("&").Add(g.C(contractError)).Values(Dict{
						Id("Op"):     Lit(c.Name + "." + m.Name),
						Id("Kind"):   g.C("ErrUnsupported"),
						Id("Detail"): Lit("the subject's " + accessor(c) + " returned a nil capability"),
					}))
				} else {
					zeros = append(zeros, g.Zero(r.Type))
				}
			}
			if errIdx >= 0 {
				b.If(cg.recv(m).Op("==").Nil()).Block(Return(zeros...))
			}
		}
		if ctxParam != "" {
			b.List(Id("ctx"), Id("done")).Op(":=").Id("e").Dot("op").Call(Lit(c.Name+"."+m.Name), Id("c").Dot(ctxParam))
			b.Defer().Id("done").Call()
		}
		if len(rs) == 0 {
			b.Add(cg.recv(m)).Dot(m.Name).Call(args...)
			return
		}
		b.List(rs...).Op(":=").Add(cg.recv(m)).Dot(m.Name).Call(args...)
		if created >= 0 {
			cond := Id(fmt.Sprintf("r%d", created)).Op("!=").Nil()
			if errIdx >= 0 {
				cond = Id(fmt.Sprintf("r%d", errIdx)).Op("==").Nil().Op("&&").Add(cond)
			}
			b.If(cond).Block(Id("e").Dot("track").Call(Id(fmt.Sprintf("r%d", created))))
		}
		b.Return(rs...)
	})
	comment(f, "call is do returning the created handle, if any, as a Handle.")
	f.Func().Params(Id("c").Op("*").Id(ct)).Id("call").Params(Id("e").Op("*").Id("env")).Params(g.C(contractHandle), Error()).BlockFunc(func(b *Group) {
		if created < 0 && errIdx < 0 {
			b.Id("c").Dot("do").Call(Id("e"))
		} else {
			var lhs []Code
			for i := range m.Returns {
				switch i {
				case created:
					lhs = append(lhs, Id("h"))
				case errIdx:
					lhs = append(lhs, Err())
				default:
					lhs = append(lhs, Id("_"))
				}
			}
			b.List(lhs...).Op(":=").Id("c").Dot("do").Call(Id("e"))
		}
		errv := Code(Nil())
		if errIdx >= 0 {
			errv = Err()
		}
		if created >= 0 {
			b.If(Id("h").Op("==").Nil()).Block(Return(Nil(), errv))
			b.Return(Id("h"), errv)
		} else {
			b.Return(Nil(), errv)
		}
	})
}
