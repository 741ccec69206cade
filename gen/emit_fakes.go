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

// fakesEmitter writes the fakes' package.
var fakesEmitter = &emitter{Name: "fakes", Requires: []*emitter{contractEmitter}, Emit: emitFakes}

func init() { register(fakesEmitter) }

// The templates of fakestmpl hold the hand-written state model of the fakes:
// host memory, accounting, streams and fences, the ledger, recording and
// fault injection. emitFakes copies each into the fakes package (template.go
// says how); everything per method (signatures, recording, stubs, canned
// results, fault points, dispatch to the state model) is generated from the
// spec below.

// fakesResult is the fakes emitter's result: what the fakes package
// declares (the templates' state model and the generated fakes), as written,
// so that an emitter whose code calls the fakes (the checked wrapper's
// examples) can tell that what it names is there.
type fakesResult struct {
	dir     string                     // the package's module-relative directory
	decls   map[string]bool            // top-level names
	methods map[string]map[string]bool // type -> its methods
}

func newFakesResult(dir string) *fakesResult {
	return &fakesResult{dir: dir, decls: map[string]bool{}, methods: map[string]map[string]bool{}}
}

func (r *fakesResult) addMethod(typ, name string) {
	if r.methods[typ] == nil {
		r.methods[typ] = map[string]bool{}
	}
	r.methods[typ][name] = true
}

// missing returns those of names (each Name or Type.Method) that the fakes
// package does not declare.
func (r *fakesResult) missing(names ...string) []string {
	var out []string
	for _, n := range names {
		typ, method, isMethod := strings.Cut(n, ".")
		if isMethod && !r.methods[typ][method] || !isMethod && !r.decls[n] {
			out = append(out, n)
		}
	}
	return out
}

// fakeCallCount is the name of the method that counts a fake's calls of
// method m.
func fakeCallCount(m string) string { return m + "CallCount" }

// fakeMechanism is the fake mechanism's type.
const fakeMechanism = "Mechanism"

// fakeDecl is one generated fake type.
type fakeDecl struct {
	Type    string        // exported type, e.g. Mechanism
	Doc     string        // type doc
	Methods []*fakeMeth   // in spec order
	Asserts []string      // contract interfaces the type implements
	Caps    []*capability // Mechanism: the capabilities (for accessors)
	res     *fakesResult  // where its declarations are recorded
}

// method starts the declaration of one of the fake's methods, recording it
// in the emitter's result.
func (d *fakeDecl) method(f *File, name string) *Statement {
	d.res.addMethod(d.Type, name)
	return f.Func().Params(Id("fake").Op("*").Id(d.Type)).Id(name)
}

// fakeMeth is one spec method of a fake, with the optional capability that
// must be offered for it to reach the state model.
type fakeMeth struct {
	*method
	Optional *capability
}

func (d *fakeDecl) state() string { return lowerFirst(d.Type) + "State" }

func emitFakes(g *generator) (any, error) {
	dir := g.Spec.Packages.Fakes
	pkg := path.Base(dir)
	res := newFakesResult(dir)
	if err := renderFakeTemplates(g, dir, res); err != nil {
		return nil, err
	}
	emitFakesDoc(g, dir, pkg)

	mech := &fakeDecl{Type: fakeMechanism, Asserts: []string{contractMechanism}, Doc: `Mechanism is a stateful in-memory mechanism that obeys the spec: host memory
behind every handle, the spec's accounting (rounding, UsedBytes,
CommittedBytes), the typed errors of the contract, and any subset of the
optional capabilities (Config.Offers). On top of the state model every method
is recorded (XCallCount, XArgsForCall, and the shared Recorder), can be
overridden (XReturns, XReturnsOnCall, XCalls; Restore drops overrides) and
can be made to fail before it changes anything (Inject). It is safe for
concurrent use.`}
	for _, c := range g.Spec.Capabilities {
		mech.Asserts = append(mech.Asserts, c.Name)
		mech.Caps = append(mech.Caps, c)
		var opt *capability
		if !c.Required {
			opt = c
		}
		for _, m := range c.Methods {
			mech.Methods = append(mech.Methods, &fakeMeth{method: m, Optional: opt})
		}
	}
	byRole := func(roles ...string) ([]*fakeMeth, []string, error) {
		var ms []*fakeMeth
		var names []string
		seen := map[string]bool{}
		for _, r := range roles {
			i := g.Spec.roleInterface(r)
			if i == nil {
				return nil, nil, fmt.Errorf("the spec declares no interface of role %q, which the fakes need", r)
			}
			names = append(names, i.Name)
			for _, m := range i.Methods {
				if !seen[m.Name] {
					seen[m.Name] = true
					ms = append(ms, &fakeMeth{method: m})
				}
			}
		}
		return ms, names, nil
	}
	decls := []*fakeDecl{mech}
	for _, d := range []struct {
		typ   string
		roles []string
		doc   string
	}{
		{"Grant", []string{roleGrant, roleAccount}, `Grant is a fake ledger grant: a budget that Draw takes from and Undraw
(and Refund: a grant is also an account) gives back, refusing draws beyond the
budget (ErrGrantExhausted) or after Close (ErrGrantClosed). Calls are
recorded and can be overridden or faulted like every fake's.`},
		{"Account", []string{roleAccount}, `Account is a fake ledger account that sums what is refunded to it. Calls are
recorded and can be overridden or faulted like every fake's.`},
		{"Context", []string{roleContext}, `Context is a fake device context over a fake Mechanism's host memory. Its
streams really copy; fences complete automatically or, with
SetManualFences, when the test says so. Calls are recorded and can be
overridden or faulted like every fake's; the context, its streams and its
fences share one fault set.`},
		{"Stream", []string{roleStream}, `Stream is a fake stream of a Context: an ordered queue of copies over the
mechanism's memory. Calls are recorded and can be overridden or faulted.`},
		{"Fence", []string{roleFence}, `Fence is a fake fence recorded on a Stream. Calls are recorded and can be
overridden or faulted.`},
	} {
		ms, names, err := byRole(d.roles...)
		if err != nil {
			return nil, err
		}
		decls = append(decls, &fakeDecl{Type: d.typ, Doc: d.doc, Methods: ms, Asserts: names})
	}
	files := map[string]string{"Mechanism": "mechanism.go", "Grant": "ledger.go", "Account": "ledger.go",
		"Context": "context.go", "Stream": "context.go", "Fence": "context.go"}
	for _, d := range decls {
		d.res = res
		res.decls[d.Type] = true
		f := g.File(dir+"/"+files[d.Type], pkg)
		emitFake(g, f, d, res.methods[d.state()])
	}
	return res, nil
}

// renderFakeTemplates writes every template of fakestmpl the spec's needs
// meet into dir and records in res what they declare (read from the syntax
// tree): among it, per state type, the methods the state model implements.
func renderFakeTemplates(g *generator, dir string, res *fakesResult) error {
	tmpls, err := g.renderTemplates(templates, "fakestmpl/*.go", path.Base(dir))
	if err != nil {
		return err
	}
	for _, t := range tmpls {
		file, err := parser.ParseFile(token.NewFileSet(), t.name, t.src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, d := range file.Decls {
			recordDecl(res, d)
		}
		g.Raw(dir+"/"+t.name, t.src)
	}
	return nil
}

// recordDecl records in res the names a top-level declaration of a template
// declares: its types, variables, constants and functions, and its methods
// by their receiver's type.
func recordDecl(res *fakesResult, d ast.Decl) {
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil || len(d.Recv.List) != 1 {
			res.decls[d.Name.Name] = true
			return
		}
		t := d.Recv.List[0].Type
		if st, ok := t.(*ast.StarExpr); ok {
			t = st.X
		}
		if id, ok := t.(*ast.Ident); ok {
			res.addMethod(id.Name, d.Name.Name)
		}
	case *ast.GenDecl:
		for _, sp := range d.Specs {
			switch sp := sp.(type) {
			case *ast.TypeSpec:
				res.decls[sp.Name.Name] = true
			case *ast.ValueSpec:
				for _, n := range sp.Names {
					res.decls[n.Name] = true
				}
			}
		}
	}
}

func emitFakesDoc(g *generator, dir, pkg string) {
	f := g.File(dir+"/doc.go", pkg)
	f.PackageComment(strings.TrimSpace(`
Package ` + pkg + ` holds stateful, recording, fault-injecting fakes of the memgen
contract, generated from spec/capabilities.yaml, for testing code that uses
device memory without a device.

NewMechanism returns a Mechanism that really behaves: allocations,
reservations, committed ranges and backings are host memory behind synthetic
device addresses (never reused), shared views see the same bytes, CopyOnWrite
copies, UsedBytes and CommittedBytes follow the spec's accounting with its
rounding, every misuse returns the contract's typed error, Config.Capacity
makes the device run out of memory, Config.Offers leaves optional
capabilities absent to test fallback paths, and Config.LyingEager reproduces
an eager allocator whose commit is a successful no-op. NewContext gives a
DeviceContext whose streams copy through that memory (a read-only view
refuses writes with ErrReadOnly) and whose fences complete automatically or
under the test's control (SetManualFences, Fence.Complete, CompleteAll).
NewGrant and NewAccount are a minimal ledger for testing wrappers without the
governor.

Every fake also offers what counterfeiter does, per spec method X: XCallCount,
XArgsForCall(i), XReturns, XReturnsOnCall(i) (counting from 0), XCalls(stub),
and Restore to go back to the state model; plus fault injection (Inject a
Fault on the Nth call of a method or whenever a predicate holds, or
InjectWith any memapi.Injector; the call fails before it changes any state)
and a Recorder that several fakes share to
keep one global order of calls. All fakes are safe for concurrent use and
start no goroutines.

Adding a method to the spec adds it to the fakes: it records, counts, takes
stubs and can be faulted at once, and reports ErrUnsupported from the state
model until the fakes' templates (gen/fakestmpl) give it behaviour.`))
}

// emitFake writes one fake type: its struct, the per-method records, the
// methods themselves and their counterfeiter-style API.
func emitFake(g *generator, f *File, d *fakeDecl, has map[string]bool) {
	lower := lowerFirst(d.Type)

	f.Var().DefsFunc(func(v *Group) {
		for _, a := range d.Asserts {
			v.Id("_").Add(g.C(a)).Op("=").Parens(Op("*").Id(d.Type)).Parens(Nil())
		}
	})
	var faultable []string
	for _, m := range d.Methods {
		if m.ReturnsError() {
			faultable = append(faultable, m.Name)
		}
	}
	sort.Strings(faultable)
	comment(f, lower+"FaultMethods are the methods of "+d.Type+" that Inject can make fail: those with an error result.")
	f.Var().Id(lower + "FaultMethods").Op("=").Add(stringList(faultable))
	f.Line()

	comment(f, d.Doc)
	f.Type().Id(d.Type).StructFunc(func(s *Group) {
		s.Op("*").Id("faults").Comment("Inject, InjectWith, ClearFaults")
		s.Id("state").Id(d.state()).Comment("the hand-written state model")
		s.Id("source").String().Comment("Call.Source of its calls")
		s.Id("rec").Op("*").Id("Recorder")
		s.Id("quiet").Bool().Comment("count calls, keep no arguments")
		s.Id("mu").Qual("sync", "Mutex").Comment("guards the records below")
		for _, m := range d.Methods {
			s.Id(recField(m)).Id(recType(d, m))
		}
	})
	f.Line()

	for _, m := range d.Methods {
		emitFakeRecordTypes(g, f, d, m)
		emitFakeMethod(g, f, d, m, has[m.Name])
		emitFakeAPI(g, f, d, m)
	}

	comment(f, "Restore drops every stub and canned result set on the fake, so each method\nruns the state model again. Recorded calls and injected faults stay.")
	d.method(f, "Restore").Params().BlockFunc(func(b *Group) {
		b.Id("fake").Dot("mu").Dot("Lock").Call()
		b.Defer().Id("fake").Dot("mu").Dot("Unlock").Call()
		for _, m := range d.Methods {
			r := Id("fake").Dot(recField(m))
			b.Add(r.Clone().Dot("stub")).Op("=").Nil()
			if len(m.Returns) > 0 {
				b.Add(r.Clone().Dot("returns")).Op("=").Nil()
				b.Add(r.Clone().Dot("onCall")).Op("=").Nil()
			}
		}
	})

	for _, c := range d.Caps {
		if c.Required {
			continue
		}
		comment(f, accessor(c)+" returns the fake as "+c.Name+" when Config.Offers has it, and nil and\nfalse otherwise.")
		d.method(f, accessor(c)).Params().Params(g.C(c.Name), Bool()).Block(
			If(Op("!").Id("fake").Dot("offers").Call(g.C(capConst(c)))).Block(Return(Nil(), False())),
			Return(Id("fake"), True()),
		)
	}
}

func recField(m *fakeMeth) string             { return lowerFirst(m.Name) + "Calls" }
func recType(d *fakeDecl, m *fakeMeth) string { return lowerFirst(d.Type) + m.Name + "Record" }
func argsType(d *fakeDecl, m *fakeMeth) string {
	return lowerFirst(d.Type) + m.Name + "Args"
}
func resultsType(d *fakeDecl, m *fakeMeth) string {
	return lowerFirst(d.Type) + m.Name + "Results"
}

// funcType is the type of a stub of m, its parameters one per line when
// the method's XCalls signature would pass sigWidth columns.
func funcType(g *generator, m *method) *Statement {
	var ps, rs []Code
	var pt, rt []string
	for _, p := range m.Params {
		ps = append(ps, g.Type(p.Type))
		pt = append(pt, g.typeText(p.Type))
	}
	for _, r := range m.Returns {
		rs = append(rs, g.Type(r.Type))
		rt = append(rt, g.typeText(r.Type))
	}
	n := len("func (fake *Mechanism) "+m.Name+"Calls(stub func(") + len(strings.Join(pt, ", ")) + len(") (") + len(strings.Join(rt, ", ")) + len(")) {")
	return Func().Add(fitParams(n, ps)).Params(rs...)
}

func resultName(i int) string { return fmt.Sprintf("result%d", i+1) }

func emitFakeRecordTypes(g *generator, f *File, d *fakeDecl, m *fakeMeth) {
	comment(f, recType(d, m)+" holds the calls, stub and canned results of "+d.Type+"."+m.Name+".")
	f.Type().Id(recType(d, m)).StructFunc(func(s *Group) {
		s.Id("count").Int()
		if len(m.Params) > 0 {
			s.Id("args").Index().Id(argsType(d, m))
		}
		s.Id("stub").Add(funcType(g, m.method))
		if len(m.Returns) > 0 {
			s.Id("returns").Op("*").Id(resultsType(d, m))
			s.Id("onCall").Map(Int()).Id(resultsType(d, m))
		}
	})
	if len(m.Params) > 0 {
		f.Type().Id(argsType(d, m)).StructFunc(func(s *Group) {
			for _, p := range m.Params {
				s.Id(p.Name).Add(g.Type(p.Type))
			}
		})
	}
	if len(m.Returns) > 0 {
		f.Type().Id(resultsType(d, m)).StructFunc(func(s *Group) {
			for i, r := range m.Returns {
				s.Id(resultName(i)).Add(g.Type(r.Type))
			}
		})
	}
}

// fakeCall is what the body of a fake's method names: the arguments as
// passed, as recorded (byte slices cloned) and as the args record, and the
// results (fakeR1...; errOut is the error result, or Null).
type fakeCall struct {
	argIDs, recArgs []Code
	argDict         Dict
	outs            []Code
	errOut          *Statement
}

func newFakeCall(m *fakeMeth) *fakeCall {
	fc := &fakeCall{argDict: Dict{}, errOut: Null()}
	for _, p := range m.Params {
		fc.argIDs = append(fc.argIDs, Id(p.Name))
		v := Id(p.Name)
		if p.Type == "[]byte" {
			v = Id("cloneBytes").Call(Id(p.Name))
		}
		fc.recArgs = append(fc.recArgs, v)
		fc.argDict[Id(p.Name)] = v
	}
	for i := range m.Returns {
		fc.outs = append(fc.outs, Id("fakeR"+fmt.Sprint(i+1)))
	}
	if m.ReturnsError() {
		fc.errOut = Id("fakeR" + fmt.Sprint(len(m.Returns)))
	}
	return fc
}

// assign returns fn's call assigned to the results, or the call alone when
// there are none.
func (fc *fakeCall) assign(fn Code) Code {
	if len(fc.outs) == 0 {
		return fn
	}
	return List(fc.outs...).Op("=").Add(fn)
}

// emitFakeMethod writes one spec method of a fake: it records the call,
// then the first of an injected fault, a stub, canned results, an absent
// capability and the state model decides the results.
func emitFakeMethod(g *generator, f *File, d *fakeDecl, m *fakeMeth, implemented bool) {
	params, results := g.Signature(m.method)
	fc := newFakeCall(m)
	comment(f, fakeMethodDoc(m, implemented))
	head := "func (fake *" + d.Type + ") " + m.Name
	d.method(f, m.Name).Add(fitParams(g.sigLen(head, nil, m.method), params)).Params(results...).BlockFunc(func(b *Group) {
		recordFakeCall(b, d, m, fc)
		for i, r := range m.Returns {
			b.Var().Id("fakeR" + fmt.Sprint(i+1)).Add(g.Type(r.Type))
		}
		b.Add(fakeDeciders(g, m, fc, implemented))
		if m.ReturnsError() {
			b.Id("fakeCall").Dot("Err").Op("=").Add(fc.errOut.Clone())
		}
		b.Id("fake").Dot("rec").Dot("record").Call(Id("fakeCall"))
		b.Return(fc.outs...)
	})
	f.Line()
}

// fakeMethodDoc is the doc of a fake's method: the spec method's, and what
// decides its results.
func fakeMethodDoc(m *fakeMeth, implemented bool) string {
	behaviour := "The fake runs its state model"
	if !implemented {
		behaviour = "The fakes' state model has no behaviour for " + m.Name + " yet: it returns ErrUnsupported"
	}
	if m.Optional != nil {
		behaviour += " when Config.Offers has " + m.Optional.Name + " and fails with ErrUnsupported otherwise"
	}
	var deciders []string
	if m.ReturnsError() {
		deciders = append(deciders, "an injected fault")
	}
	deciders = append(deciders, "a stub ("+m.Name+"Calls)")
	if len(m.Returns) > 0 {
		deciders = append(deciders, "canned results ("+m.Name+"Returns, "+m.Name+"ReturnsOnCall)")
	}
	return methodDoc(m.method) + "\n\n" + behaviour + ", unless " + strings.Join(deciders, ", ") + " decide first, in that order. Every call is recorded."
}

// recordFakeCall writes, under the fake's lock, the call's count, its
// arguments, and the stub and canned results it finds; then the Call it
// records (with the arguments when a recorder or a fault wants them).
func recordFakeCall(b *Group, d *fakeDecl, m *fakeMeth, fc *fakeCall) {
	rec := func() *Statement { return Id("fake").Dot(recField(m)) }
	b.Id("fake").Dot("mu").Dot("Lock").Call()
	b.Id("fakeI").Op(":=").Add(rec().Dot("count"))
	b.Add(rec().Dot("count")).Op("++")
	if len(m.Params) > 0 {
		b.If(Op("!").Id("fake").Dot("quiet")).Block(
			rec().Dot("args").Op("=").Append(rec().Dot("args"), Id(argsType(d, m)).Values(fc.argDict)),
		)
	}
	b.Id("fakeStub").Op(":=").Add(rec().Dot("stub"))
	if len(m.Returns) > 0 {
		b.List(Id("fakeRet"), Id("fakeCanned")).Op(":=").Add(rec().Dot("onCall")).Index(Id("fakeI"))
		b.If(Op("!").Id("fakeCanned").Op("&&").Add(rec().Dot("returns")).Op("!=").Nil()).Block(
			List(Id("fakeRet"), Id("fakeCanned")).Op("=").List(Op("*").Add(rec().Dot("returns")), True()),
		)
	} else {
		b.Id("_").Op("=").Id("fakeI")
	}
	b.Id("fake").Dot("mu").Dot("Unlock").Call()
	b.Id("fakeCall").Op(":=").Id("Call").Values(Dict{Id("Source"): Id("fake").Dot("source"), Id("Method"): Lit(m.Name)})
	if len(m.Params) > 0 {
		cond := Id("fake").Dot("rec").Op("!=").Nil()
		if m.ReturnsError() {
			cond = cond.Op("||").Id("fake").Dot("armed").Call()
		}
		b.If(cond).Block(Id("fakeCall").Dot("Args").Op("=").Index().Any().Values(fc.recArgs...))
	}
}

// fakeDeciders is the if-else chain that decides a fake call's results, the
// first match winning: an injected fault, the stub, canned results, an
// optional capability not offered, and last the state model (or, for a
// method it has no behaviour for, errNoBehaviour).
func fakeDeciders(g *generator, m *fakeMeth, fc *fakeCall, implemented bool) Code {
	type decider struct {
		cond []Code
		body []Code
	}
	var chain []decider
	add := func(cond Code, body ...Code) { chain = append(chain, decider{[]Code{cond}, body}) }
	if m.ReturnsError() {
		chain = append(chain, decider{
			[]Code{Id("fakeErr").Op(":=").Id("fake").Dot("check").Call(Op("&").Id("fakeCall")), Id("fakeErr").Op("!=").Nil()},
			[]Code{fc.errOut.Clone().Op("=").Id("fakeErr")},
		})
	}
	add(Id("fakeStub").Op("!=").Nil(), fc.assign(Id("fakeStub").Call(fc.argIDs...)))
	if len(m.Returns) > 0 {
		var canned []Code
		for i := range m.Returns {
			canned = append(canned, Id("fakeRet").Dot(resultName(i)))
		}
		add(Id("fakeCanned"), List(fc.outs...).Op("=").List(canned...))
	}
	if m.Optional != nil {
		absent := Id("fake").Dot("absent").Call(Lit(m.Optional.Name), Lit(m.Name))
		if m.ReturnsError() {
			add(Op("!").Id("fake").Dot("offers").Call(g.C(capConst(m.Optional))), fc.errOut.Clone().Op("=").Add(absent))
		} else {
			add(Op("!").Id("fake").Dot("offers").Call(g.C(capConst(m.Optional))), Comment("absent: zero results"))
		}
	}
	var dflt Code
	switch {
	case implemented:
		dflt = fc.assign(Id("fake").Dot("state").Dot(m.Name).Call(fc.argIDs...))
	case m.ReturnsError():
		dflt = fc.errOut.Clone().Op("=").Id("errNoBehaviour").Call(Lit(m.Owner + "." + m.Name))
	default:
		dflt = Comment("no behaviour yet: zero results")
	}
	var st *Statement
	for i, c := range chain {
		if i == 0 {
			st = If(c.cond...).Block(c.body...)
		} else {
			st = st.Else().If(c.cond...).Block(c.body...)
		}
	}
	return st.Else().Block(dflt)
}

func emitFakeAPI(g *generator, f *File, d *fakeDecl, m *fakeMeth) {
	rec := func() *Statement { return Id("fake").Dot(recField(m)) }
	lock := []Code{Id("fake").Dot("mu").Dot("Lock").Call(), Defer().Id("fake").Dot("mu").Dot("Unlock").Call()}

	comment(f, fakeCallCount(m.Name)+" returns how many times "+m.Name+" was called.")
	d.method(f, fakeCallCount(m.Name)).Params().Int().Block(
		append(lock, Return(rec().Dot("count")))...,
	)

	if len(m.Params) > 0 {
		var types, vals []Code
		for _, p := range m.Params {
			types = append(types, g.Type(p.Type))
			vals = append(vals, Id("a").Dot(p.Name))
		}
		comment(f, m.Name+"ArgsForCall returns the arguments of the i-th call of "+m.Name+", counting\nfrom 0. It panics for a fake made with Config.Quiet.")
		n := len("func (fake *" + d.Type + ") " + m.Name + "ArgsForCall(i int) () {")
		for _, p := range m.Params {
			n += len(g.typeText(p.Type)) + 2
		}
		d.method(f, m.Name+"ArgsForCall").Params(Id("i").Int()).Add(fitParams(n, types)).Block(
			append(lock,
				If(Id("fake").Dot("quiet")).Block(Panic(Lit("fakes: "+d.Type+"."+m.Name+"ArgsForCall: a Quiet fake keeps no arguments"))),
				Id("a").Op(":=").Add(rec().Dot("args")).Index(Id("i")),
				Return(vals...),
			)...,
		)
	}

	if len(m.Returns) > 0 {
		var ps []Code
		vals := Dict{}
		for i, r := range m.Returns {
			ps = append(ps, Id(resultName(i)).Add(g.Type(r.Type)))
			vals[Id(resultName(i))] = Id(resultName(i))
		}
		comment(f, m.Name+"Returns makes every later call of "+m.Name+" return these results\ninstead of running the state model, and drops a stub set by "+m.Name+"Calls.")
		d.method(f, m.Name+"Returns").Params(ps...).Block(
			append(lock,
				rec().Dot("stub").Op("=").Nil(),
				rec().Dot("returns").Op("=").Op("&").Id(resultsType(d, m)).Values(vals),
			)...,
		)
		comment(f, m.Name+"ReturnsOnCall makes the i-th call of "+m.Name+" (counting from 0) return\nthese results, and drops a stub set by "+m.Name+"Calls.")
		onCall := append([]Code{Id("i").Int()}, ps...)
		n := len("func (fake *"+d.Type+") "+m.Name+"ReturnsOnCall(i int") + 2
		for i, r := range m.Returns {
			n += len(resultName(i)) + 3 + len(g.typeText(r.Type))
		}
		d.method(f, m.Name+"ReturnsOnCall").Add(fitParams(n, onCall)).Block(
			append(lock,
				rec().Dot("stub").Op("=").Nil(),
				If(rec().Dot("onCall").Op("==").Nil()).Block(rec().Dot("onCall").Op("=").Map(Int()).Id(resultsType(d, m)).Values()),
				rec().Dot("onCall").Index(Id("i")).Op("=").Id(resultsType(d, m)).Values(vals),
			)...,
		)
	}

	comment(f, m.Name+"Calls makes "+m.Name+" call stub instead of the state model (nil removes\nthe stub). Injected faults still come first.")
	d.method(f, m.Name+"Calls").Params(Id("stub").Add(funcType(g, m.method))).Block(
		append(lock, rec().Dot("stub").Op("=").Id("stub"))...,
	)
	f.Line()
}
