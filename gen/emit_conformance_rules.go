package gen

import (
	"fmt"
	"go/format"
	"strings"

	. "github.com/dave/jennifer/jen"
)

// Invariants the conformance suite checks per method. Invariants with other
// ids govern layers above the mechanism (the ledger, the device context, the
// manager) and are tested there.
const (
	invChargeBeforeCommit = "charge-before-commit"
	invNoPartialState     = "no-partial-state"
	invReleaseByCreator   = "release-by-creator"
	invNoSilentNoop       = "no-silent-noop"
)

// emitRules writes rules.go: the subtests derived from the spec.
func (cg *confGen) emitRules() error {
	s := cg.g.Spec
	cg.funcs = cg.file("rules.go")
	f := cg.funcs
	var lines []string
	for _, iv := range s.Invariants {
		switch iv.ID {
		case invChargeBeforeCommit, invNoPartialState, invReleaseByCreator, invNoSilentNoop:
			lines = append(lines, fmt.Sprintf("  - %s: invariant/%s/...", iv.ID, iv.ID))
		default:
			lines = append(lines, fmt.Sprintf("  - %s: not a property of one mechanism; enforced by %s", iv.ID, strings.Join(iv.EnforcedBy, ", ")))
		}
	}
	comment(f, "The subtests below are derived from the spec: per method from its\naccounting effect, what it creates and releases and its requires clauses;\nper optional capability from its absence; per invariant from what it\napplies to. The invariants of the spec and where the suite checks them:\n\n"+strings.Join(lines, "\n"))
	f.Line()
	for _, c := range s.Capabilities {
		if !c.Required {
			cg.absent(c)
		}
		for _, m := range c.Methods {
			if err := cg.methodRules(c, m); err != nil {
				return err
			}
		}
	}
	for _, iv := range s.Invariants {
		if iv.ID != invNoSilentNoop {
			continue
		}
		for _, name := range iv.Applies.Capabilities {
			if c := s.Capability(name); c != nil {
				if err := cg.noSilentNoop(c); err != nil {
					return err
				}
			}
		}
	}
	comment(f, "specTests are the derived subtests, in spec order.")
	f.Var().Id("specTests").Op("=").Index().Id("test").Values(cg.tests...)
	return cg.emitExample()
}

// emitExample writes a runnable example whose output, derived from the spec,
// lists the release-by-creator subtests: one per releasing method.
func (cg *confGen) emitExample() error {
	prefix := "invariant/" + invReleaseByCreator + "/"
	var out []string
	for _, n := range cg.order {
		if strings.HasPrefix(n, prefix) {
			out = append(out, "\t// "+n)
		}
	}
	if len(out) == 0 {
		return nil
	}
	conf := cg.g.Import(cg.g.Spec.Packages.Conformance)
	src := cg.g.header("") + `

package conformance_test

import (
	"fmt"
	"strings"

	"` + conf + `"
)

// A mechanism package runs the whole suite with conformance.Run(t, factory).
// The subtests are named by capability and invariant, so go test -run selects
// them: every releasing method of the spec has a release-by-creator subtest.
func ExampleNames() {
	for _, n := range conformance.Names() {
		if strings.HasPrefix(n, "` + prefix + `") {
			fmt.Println(n)
		}
	}
	// Output:
` + strings.Join(out, "\n") + `
}
`
	b, err := format.Source([]byte(src))
	if err != nil {
		return fmt.Errorf("conformance example: %w", err)
	}
	cg.g.Raw(cg.g.Spec.Packages.Conformance+"/example_test.go", b)
	return nil
}

// add registers one subtest with its body.
func (cg *confGen) add(name string, c *capability, body ...Code) {
	if cg.names[name] {
		// Unreachable: names are Capability/Method/case with method names
		// unique across capabilities (checked in emitConformance).
		panic("conformance: duplicate subtest " + name)
	}
	cg.names[name] = true
	cg.order = append(cg.order, name)
	fn := "spec" + camel(name)
	comment(cg.funcs, fn+" is the subtest "+name+".")
	cg.funcs.Func().Id(fn).Params(Id("t").Id("T"), Id("e").Op("*").Id("env")).Block(body...)
	cg.funcs.Line()
	cg.tests = append(cg.tests, Line().Values(Lit(name), cg.needs(c), Id(fn)))
}

// camel turns a subtest name into a Go identifier part.
func camel(name string) string {
	var b strings.Builder
	up := true
	for _, r := range name {
		switch {
		case r == '/' || r == '-' || r == '_' || r == ' ':
			up = true
		case up:
			b.WriteString(strings.ToUpper(string(r)))
			up = false
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// fixture returns `c := e.valid<M>(t)` (or `c = ...` when again).
func (cg *confGen) fixture(m *method, again bool) Code {
	cg.used[m.Name] = m
	op := ":="
	if again {
		op = "="
	}
	return Id("c").Op(op).Id("e").Dot("valid" + m.Name).Call(Id("t"))
}

func envs(es ...string) Code {
	var vs []Code
	for _, e := range es {
		vs = append(vs, Id(e))
	}
	return Index().Op("*").Id("env").Values(vs...)
}

// refuse returns the call of the suite's refuse helper on c.call.
func (cg *confGen) refuse(what string, es []string, kinds ...string) Code {
	args := []Code{Id("t"), Lit(what), envs(es...), Id("c").Dot("call"), Id("e")}
	for _, k := range kinds {
		args = append(args, cg.g.C(k))
	}
	return Id("refuse").Call(args...)
}

func (cg *confGen) hasError(name string) bool {
	for _, e := range cg.g.Spec.Errors {
		if e.Name == name {
			return true
		}
	}
	return false
}

// expr returns Go code reading x from the call c: handle fields are methods,
// struct fields are fields; committed(h) asks the spec's committed query.
func (cg *confGen) expr(m *method, x *expr) (*Statement, string, error) {
	s := cg.g.Spec
	p := m.Param(x.Param)
	if p == nil {
		return nil, "", fmt.Errorf("conformance: %s.%s: %q names no parameter", m.Owner, m.Name, x.Text)
	}
	if x.Func == "committed" {
		return Id("e").Dot("committed"+p.Type).Call(Id("t"), Id("c").Dot(p.Name)), "Bytes", nil
	}
	code := Id("c").Dot(p.Name)
	cur := p.Type
	for _, fname := range x.Path {
		t := s.Type(cur)
		if t == nil {
			return nil, "", fmt.Errorf("conformance: %s.%s: %q: %s has no fields", m.Owner, m.Name, x.Text, cur)
		}
		fd := t.Field(fname)
		if fd == nil {
			return nil, "", fmt.Errorf("conformance: %s.%s: %q: %s has no field %s", m.Owner, m.Name, x.Text, cur, fname)
		}
		if t.Kind == KindHandle {
			code = code.Dot(fname).Call()
		} else {
			code = code.Dot(fname)
		}
		cur = fd.Type
	}
	return code, cur, nil
}

// lvalue is expr for an assignable expression: a parameter or a path through
// struct fields (handles are read-only).
func (cg *confGen) lvalue(m *method, x *expr) (*Statement, error) {
	if x.Func != "" {
		return nil, fmt.Errorf("conformance: %s.%s: cannot assign to %q", m.Owner, m.Name, x.Text)
	}
	cur := m.Param(x.Param).Type
	for _, fname := range x.Path {
		t := cg.g.Spec.Type(cur)
		if t.Kind == KindHandle {
			return nil, fmt.Errorf("conformance: %s.%s: cannot assign to %q: it goes through handle %s", m.Owner, m.Name, x.Text, cur)
		}
		cur = t.Field(fname).Type
	}
	code, _, err := cg.expr(m, x)
	return code, err
}

func roundConst(r string) string {
	switch r {
	case roundAlloc:
		return "roundAlloc"
	case roundGranularity:
		return "roundGranularity"
	}
	return "roundNone"
}

// amount returns `want := e.round(t, <amount>, <unit>)` for a consuming or
// refunding method, evaluated before the call.
func (cg *confGen) amount(m *method) (Code, error) {
	a := m.Accounting
	code, _, err := cg.expr(m, a.Amount)
	if err != nil {
		return nil, err
	}
	return Id("want").Op(":=").Id("e").Dot("round").Call(Id("t"), code, Id(roundConst(a.Round))), nil
}

// mustCall returns the call of c with a fatal check; created tells whether
// to keep the created handle in h.
func mustCall(m *method, keep bool) Code {
	fail := Id("t").Dot("Fatalf").Call(Lit(m.Name+": %v"), Err())
	if keep {
		return Add(List(Id("h"), Err()).Op(":=").Id("c").Dot("call").Call(Id("e"))).Line().If(Err().Op("!=").Nil()).Block(fail)
	}
	return If(List(Id("_"), Err()).Op(":=").Id("c").Dot("call").Call(Id("e")), Err().Op("!=").Nil()).Block(fail)
}

// methodRules registers the subtests of one method: from what it creates,
// from its accounting effect, from what it releases and from each of its
// requires clauses.
func (cg *confGen) methodRules(c *capability, m *method) error {
	if m.Creates != "" {
		cg.createsRule(c, m)
	}
	var err error
	switch m.Accounting.Effect {
	case effectConsumes:
		err = cg.consumesRules(c, m)
	case effectRefunds:
		err = cg.refundsRules(c, m)
	case effectNone:
		cg.add(rulePrefix(c, m)+"no-accounting", c,
			cg.fixture(m, false),
			Id("before").Op(":=").Id("e").Dot("books").Call(),
			mustCall(m, false),
			Id("e").Dot("expectConsumed").Call(Id("t"), Lit(m.Name), Id("before"), Lit(0)),
		)
	}
	if err != nil {
		return err
	}
	if m.Releases != "" {
		cg.releaseRules(c, m)
	}
	return cg.requiresRules(c, m)
}

// rulePrefix is the start of the name of every subtest of one method.
func rulePrefix(c *capability, m *method) string { return c.Name + "/" + m.Name + "/" }

// invariant returns the spec's invariant of the given id, or nil.
func (cg *confGen) invariant(id string) *invariant {
	for _, iv := range cg.g.Spec.Invariants {
		if iv.ID == id {
			return iv
		}
	}
	return nil
}

// createsRule: a valid call creates a live handle of this instance.
func (cg *confGen) createsRule(c *capability, m *method) {
	cg.add(rulePrefix(c, m)+"creates-live-handle", c,
		cg.fixture(m, false),
		List(Id("h"), Err()).Op(":=").Id("c").Dot("call").Call(Id("e")),
		If(Err().Op("!=").Nil()).Block(Id("t").Dot("Fatalf").Call(Lit(m.Name+": %v"), Err())),
		Id("checkCreated").Call(Id("t"), Id("e"), Lit(m.Name), Id("h")),
	)
}

// consumesRules: a consuming call draws exactly its rounded amount (and,
// with a witness, really does its work; a created handle is as large as the
// amount); under charge-before-commit it is refused without a grant; under
// no-partial-state a grant that cannot be drawn from leaves nothing behind.
func (cg *confGen) consumesRules(c *capability, m *method) error {
	if err := cg.exactAccountingRule(c, m); err != nil {
		return err
	}
	g := cg.g
	gp := m.Accounting.Account
	if iv := cg.invariant(invChargeBeforeCommit); iv != nil && iv.Applies.Consumes {
		cg.add("invariant/"+invChargeBeforeCommit+"/"+m.Name, c,
			cg.fixture(m, false),
			Id("c").Dot(gp).Op("=").Nil(),
			cg.refuse(m.Name+" without a grant", []string{"e"}, "ErrNoGrant"),
			cg.fixture(m, true),
			Id("c").Dot(gp).Op("=").Id("e").Dot("newGrant").Call(Id("e").Dot("info").Dot("Authority").Op("+").Lit("/other"), Id("unlimited")),
			Id("tolerate").Call(Id("t"), Lit(m.Name+" with a grant of another authority"), Id("e"), Id("c").Dot("call"), g.C("ErrAuthorityMismatch")),
		)
	}
	if iv := cg.invariant(invNoPartialState); iv != nil && iv.Applies.Consumes {
		cg.add("invariant/"+invNoPartialState+"/"+m.Name, c,
			cg.fixture(m, false),
			Id("c").Dot(gp).Op("=").Id("e").Dot("newGrant").Call(Id("e").Dot("info").Dot("Authority"), Lit(0)),
			Id("tolerate").Call(Id("t"), Lit(m.Name+" with a grant that cannot be drawn from"), Id("e"), Id("c").Dot("call"), g.C("ErrGrantExhausted")),
		)
	}
	return nil
}

// exactAccountingRule: a valid consuming call moves the books by exactly
// the declared amount, rounded; its witness sees the work done through the
// device context; the handle it creates, when sized, has that size.
func (cg *confGen) exactAccountingRule(c *capability, m *method) error {
	want, err := cg.amount(m)
	if err != nil {
		return err
	}
	ht := cg.g.Spec.Type(m.Creates)
	sized := ht != nil && ht.Field("Size") != nil
	witness := cg.witnesses[m.Name]
	body := []Code{cg.fixture(m, false), want}
	if witness {
		body = append(body, Id("witness").Op(":=").Id("e").Dot("witness"+m.Name).Call(Id("t"), Id("c")))
	} else {
		cg.unwitnessed = append(cg.unwitnessed, m)
	}
	body = append(body,
		Id("before").Op(":=").Id("e").Dot("books").Call(),
		mustCall(m, sized || witness),
		Id("e").Dot("expectConsumed").Call(Id("t"), Lit(m.Name), Id("before"), Id("want")),
	)
	if witness {
		// The books are the mechanism's word; the witness reads the memory.
		body = append(body, Id("witness").Call(Id("h")))
	}
	if sized {
		body = append(body,
			Id("checkCreated").Call(Id("t"), Id("e"), Lit(m.Name), Id("h")),
			If(
				List(Id("x"), Id("_")).Op(":=").Id("h").Assert(Op("*").Add(cg.g.C(m.Creates))),
				Id("x").Op("!=").Nil().Op("&&").Id("x").Dot("Size").Call().Op("!=").Id("want"),
			).Block(
				Id("t").Dot("Errorf").Call(Lit(m.Name+": the "+m.Creates+"'s Size() is %d, want %d (the amount rounded as the spec declares)"), Id("x").Dot("Size").Call(), Id("want")),
			),
		)
	}
	cg.add(rulePrefix(c, m)+"exact-accounting", c, body...)
	return nil
}

// refundsRules: a valid refunding call gives back exactly its rounded
// amount and releases what it releases; without an account it is refused.
func (cg *confGen) refundsRules(c *capability, m *method) error {
	a := m.Accounting
	want, err := cg.amount(m)
	if err != nil {
		return err
	}
	body := []Code{
		cg.fixture(m, false),
		want,
		Id("before").Op(":=").Id("e").Dot("books").Call(),
		mustCall(m, false),
		Id("e").Dot("expectRefunded").Call(Id("t"), Lit(m.Name), Id("before"), Id("want")),
	}
	if m.Releases != "" {
		body = append(body, If(Id("c").Dot(m.Releases).Dot("Live").Call()).Block(
			Id("t").Dot("Errorf").Call(Lit(m.Name+" succeeded but "+m.Releases+" is still live")),
		))
	}
	cg.add(rulePrefix(c, m)+"exact-refund", c, body...)
	if cg.hasError("ErrNoAccount") {
		cg.add(rulePrefix(c, m)+"nil-account", c,
			cg.fixture(m, false),
			Id("c").Dot(a.Account).Op("=").Nil(),
			Id("tolerate").Call(Id("t"), Lit(m.Name+" without an account"), Id("e"), Id("c").Dot("call"), cg.g.C("ErrNoAccount")),
		)
	}
	return nil
}

// releaseRules: a released handle cannot be released again, two releases
// racing succeed once, and a handle of another instance is refused (the
// release-by-creator invariant, when the spec applies it to releases).
func (cg *confGen) releaseRules(c *capability, m *method) {
	pre, x := rulePrefix(c, m), m.Releases
	cg.add(pre+"double-release", c,
		cg.fixture(m, false),
		If(List(Id("_"), Err()).Op(":=").Id("c").Dot("call").Call(Id("e")), Err().Op("!=").Nil()).Block(
			Id("t").Dot("Fatalf").Call(Lit("first "+m.Name+": %v"), Err()),
		),
		cg.refuse(m.Name+" of an already released "+x, []string{"e"}, "ErrReleased"),
	)
	cg.add(pre+"concurrent-release", c,
		For(Range().Lit(4)).Block(
			cg.fixture(m, false),
			Id("releaseRace").Call(Id("t"), Lit(m.Name), Id("e"), Id("c").Dot("call")),
		),
	)
	name := pre + "foreign-" + x
	if iv := cg.invariant(invReleaseByCreator); iv != nil && iv.Applies.Releases {
		name = "invariant/" + invReleaseByCreator + "/" + m.Name
	}
	cg.add(name, c, cg.foreign(m, x)...)
}

// clauses is what the subtests of one requires clause need to know of the
// method's other clauses.
type clauses struct {
	aligned bool            // the method requires an aligned range
	fits    map[string]bool // the ranges the method requires to fit a handle
}

// requiresRules registers the subtests of each requires clause of m: a call
// that breaks the clause is refused with the clause's error.
func (cg *confGen) requiresRules(c *capability, m *method) error {
	cl := clauses{fits: map[string]bool{}}
	for _, r := range m.Requires {
		switch r.Pred {
		case predAligned:
			cl.aligned = true
		case predFits:
			cl.fits[r.Args[0].Text] = true
		}
	}
	for _, r := range m.Requires {
		var err error
		switch r.Pred {
		case predLive:
			err = cg.liveRules(c, m, r)
		case predWithin:
			err = cg.withinRules(c, m, r, cl)
		case predAligned:
			err = cg.alignedRule(c, m, r, cl)
		case predPositive:
			err = cg.positiveRules(c, m, r)
		case predFits:
			err = cg.fitsRule(c, m, r)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// granule is the statement reading the mechanism's granularity into g.
func granule() Code { return Id("g").Op(":=").Id("e").Dot("gran").Call(Id("t")) }

// liveRules, for live(x): a nil x, a released x and another instance's x
// are refused (for the handle the method releases, the release rules cover
// the last two).
func (cg *confGen) liveRules(c *capability, m *method, r *requirement) error {
	pre, x := rulePrefix(c, m), r.Args[0].Param
	if !cg.g.IsHandle(m.Param(x).Type) {
		return fmt.Errorf("conformance: %s.%s: live(%s) of a value that is not a handle", m.Owner, m.Name, x)
	}
	cg.add(pre+"nil-"+x, c,
		cg.fixture(m, false),
		Id("c").Dot(x).Op("=").Nil(),
		cg.refuse(m.Name+" with a nil "+x, []string{"e"}, "ErrNilHandle"),
	)
	if x == m.Releases {
		return nil // double-release and the foreign test cover it
	}
	cg.add(pre+"released-"+x, c,
		cg.fixture(m, false),
		Id("e").Dot("release").Call(Id("t"), Id("c").Dot(x)),
		cg.refuse(m.Name+" with a released "+x, []string{"e"}, "ErrReleased"),
	)
	cg.add(pre+"foreign-"+x, c, cg.foreign(m, x)...)
	return nil
}

// withinRules, for within(r, h): a range past the end of h, straddling it
// or whose end overflows is refused, and so is an empty range (unless the
// range must also fit h).
func (cg *confGen) withinRules(c *capability, m *method, r *requirement, cl clauses) error {
	g := cg.g
	rv, err := cg.lvalue(m, r.Args[0])
	if err != nil {
		return err
	}
	hv, ht, err := cg.expr(m, r.Args[1])
	if err != nil {
		return err
	}
	if td := g.Spec.Type(ht); td == nil || td.Kind != KindHandle || td.Field("Size") == nil {
		return fmt.Errorf("conformance: %s.%s: within(%s, %s) needs a handle with a Size", m.Owner, m.Name, r.Args[0].Text, r.Args[1].Text)
	}
	size := hv.Clone().Dot("Size").Call()
	body := []Code{
		cg.fixture(m, false),
		rv.Clone().Op("=").Add(g.C("Range")).Values(Dict{Id("Off"): size.Clone(), Id("Len"): rv.Clone().Dot("Len")}),
		cg.refuse(m.Name+" of a range past the end of "+r.Args[1].Text, []string{"e"}, "ErrInvalidRange"),
	}
	if cl.aligned {
		body = append(body,
			granule(),
			cg.fixture(m, true),
			If(rv.Clone().Dot("Len").Op(">").Id("g")).Block(
				rv.Clone().Dot("Off").Op("=").Add(size.Clone()).Op("-").Id("g"),
				cg.refuse(m.Name+" of a range straddling the end of "+r.Args[1].Text, []string{"e"}, "ErrInvalidRange"),
			),
			cg.fixture(m, true),
			rv.Clone().Dot("Off").Op("=").Op("^").Add(g.C("Bytes")).Call(Lit(0)).Op("/").Id("g").Op("*").Id("g"),
		)
	} else {
		body = append(body,
			cg.fixture(m, true),
			rv.Clone().Dot("Off").Op("=").Add(size.Clone()).Op("-").Add(rv.Clone().Dot("Len")).Op("/").Lit(2),
			cg.refuse(m.Name+" of a range straddling the end of "+r.Args[1].Text, []string{"e"}, "ErrInvalidRange"),
			cg.fixture(m, true),
			rv.Clone().Dot("Off").Op("=").Op("^").Add(g.C("Bytes")).Call(Lit(0)).Op("-").Add(rv.Clone().Dot("Len")).Op("/").Lit(2),
		)
	}
	body = append(body, cg.refuse(m.Name+" of a range whose end overflows", []string{"e"}, "ErrInvalidRange"))
	cg.add(rulePrefix(c, m)+"out-of-range", c, body...)
	if !cl.fits[r.Args[0].Text] {
		cg.add(rulePrefix(c, m)+"empty-range", c,
			cg.fixture(m, false),
			rv.Clone().Dot("Len").Op("=").Lit(0),
			cg.refuse(m.Name+" of an empty range", []string{"e"}, "ErrInvalidRange"),
		)
	}
	return nil
}

// alignedRule, for aligned(r): a range whose offset (or, unless it must
// fit a handle, length) is half a granule off is refused.
func (cg *confGen) alignedRule(c *capability, m *method, r *requirement, cl clauses) error {
	rv, err := cg.lvalue(m, r.Args[0])
	if err != nil {
		return err
	}
	body := []Code{
		granule(),
		If(Id("g").Op("<").Lit(2)).Block(Id("t").Dot("Skipf").Call(Lit("granularity %d: every range is aligned"), Id("g"))),
		cg.fixture(m, false),
		rv.Clone().Dot("Off").Op("+=").Id("g").Op("/").Lit(2),
		cg.refuse(m.Name+" of a range whose offset is half a granule off", []string{"e"}, "ErrUnaligned"),
	}
	if !cl.fits[r.Args[0].Text] {
		body = append(body,
			cg.fixture(m, true),
			rv.Clone().Dot("Len").Op("-=").Id("g").Op("/").Lit(2),
			cg.refuse(m.Name+" of a range whose length is half a granule off", []string{"e"}, "ErrUnaligned"),
		)
	}
	cg.add(rulePrefix(c, m)+"unaligned", c, body...)
	return nil
}

// positiveRules, for positive(x): x = 0 is refused, and so is a size too
// large to hold or to round up.
func (cg *confGen) positiveRules(c *capability, m *method, r *requirement) error {
	lv, err := cg.lvalue(m, r.Args[0])
	if err != nil {
		return err
	}
	pre, x := rulePrefix(c, m), r.Args[0].Text
	cg.add(pre+"zero-size", c,
		cg.fixture(m, false),
		lv.Clone().Op("=").Lit(0),
		cg.refuse(m.Name+" with "+x+" = 0", []string{"e"}, "ErrInvalidSize"),
	)
	cg.add(pre+"huge-size", c,
		cg.fixture(m, false),
		lv.Clone().Op("=").Lit(1).Op("<<").Lit(62),
		cg.refuse(m.Name+" with "+x+" = 1<<62", []string{"e"}, "ErrInvalidSize", "ErrOutOfMemory"),
		cg.fixture(m, true),
		lv.Clone().Op("=").Op("^").Add(cg.g.C("Bytes")).Call(Lit(0)),
		cg.refuse(m.Name+" with "+x+" = 1<<64-1 (rounding it up overflows)", []string{"e"}, "ErrInvalidSize", "ErrOutOfMemory"),
	)
	return nil
}

// fitsRule, for fits(r, h): a range longer or shorter than h is refused.
func (cg *confGen) fitsRule(c *capability, m *method, r *requirement) error {
	rv, err := cg.lvalue(m, r.Args[0])
	if err != nil {
		return err
	}
	bv, bt, err := cg.expr(m, r.Args[1])
	if err != nil {
		return err
	}
	if td := cg.g.Spec.Type(bt); td == nil || td.Field("Size") == nil {
		return fmt.Errorf("conformance: %s.%s: fits(%s, %s) needs a handle with a Size", m.Owner, m.Name, r.Args[0].Text, r.Args[1].Text)
	}
	bsize := bv.Clone().Dot("Size").Call()
	cg.add(rulePrefix(c, m)+"size-mismatch", c,
		granule(),
		cg.fixture(m, false),
		rv.Clone().Dot("Len").Op("=").Add(bsize.Clone()).Op("+").Id("g"),
		cg.refuse(m.Name+" of a range longer than "+r.Args[1].Text, []string{"e"}, "ErrInvalidRange", "ErrInvalidSize"),
		cg.fixture(m, true),
		If(bsize.Clone().Op(">").Id("g")).Block(
			rv.Clone().Dot("Len").Op("=").Add(bsize.Clone()).Op("-").Id("g"),
			cg.refuse(m.Name+" of a range shorter than "+r.Args[1].Text, []string{"e"}, "ErrInvalidRange", "ErrInvalidSize"),
		),
	)
	return nil
}

// foreign is the body of a test that passes, for handle parameter x, a
// handle made by another instance: the call must fail with ErrForeignHandle
// and change nothing in either instance.
func (cg *confGen) foreign(m *method, x string) []Code {
	return []Code{
		cg.fixture(m, false),
		Id("o").Op(":=").Id("e").Dot("other").Call(Id("t")),
		Id("c").Dot(x).Op("=").Id("o").Dot("valid" + m.Name).Call(Id("t")).Dot(x),
		cg.refuse(m.Name+" of "+article(m.Param(x).Type)+" "+m.Param(x).Type+" made by another instance", []string{"e", "o"}, "ErrForeignHandle"),
	}
}

// absent writes the subtest of an optional capability's accessor: absent
// means Require reports ErrUnsupported and Negotiate leaves it out; present
// means a non-nil capability that Negotiate and Require agree on.
func (cg *confGen) absent(c *capability) {
	g := cg.g
	acc := Id("e").Dot("m").Dot(accessor(c))
	body := []Code{
		List(Id("v"), Id("ok")).Op(":=").Add(acc).Call(),
		List(Id("_"), Id("again")).Op(":=").Add(acc.Clone()).Call(),
		List(Id("r"), Err()).Op(":=").Add(g.C(requireFunc(c))).Call(Id("e").Dot("m")),
		Id("checkAccessor").Call(Id("t"), Lit(c.Name), Id("ok"), Id("v").Op("!=").Nil(), Id("again").Op("==").Id("ok"), Id("r").Op("!=").Nil(), Err(),
			g.C(contractNegotiate).Call(Id("e").Dot("m")).Dot("Has").Call(g.C(capConst(c)))),
	}
	// Absence must not depend on what else the subject offers: no needs but DeviceAllocator.
	name := c.Name + "/absent-means-unsupported"
	cg.names[name] = true
	cg.order = append(cg.order, name)
	fn := "spec" + camel(name)
	comment(cg.funcs, fn+" is the subtest "+name+".")
	cg.funcs.Func().Id(fn).Params(Id("t").Id("T"), Id("e").Op("*").Id("env")).Block(body...)
	cg.funcs.Line()
	var req []Code
	for _, x := range g.Spec.Capabilities {
		if x.Required {
			req = append(req, g.C(capConst(x)))
		}
	}
	cg.tests = append(cg.tests, Line().Values(Lit(name), g.C(contractOf).Call(req...), Id(fn)))
}

// noSilentNoop writes invariant/no-silent-noop/<Cap>: when the capability is
// claimed, a valid call of each of its methods must work and move the books
// as declared, and, for a method with a witness (every consuming one has
// one), do its work as seen through the device context: the counters alone
// are the mechanism's word.
func (cg *confGen) noSilentNoop(c *capability) error {
	var body []Code
	for _, m := range c.Methods {
		if len(m.Params) == 0 && !m.ReturnsError() {
			continue // Info, UsedBytes: nothing to refuse
		}
		blk := []Code{cg.fixture(m, false)}
		a := m.Accounting
		if a.Effect == effectConsumes || a.Effect == effectRefunds {
			want, err := cg.amount(m)
			if err != nil {
				return err
			}
			blk = append(blk, want)
		}
		witness := cg.witnesses[m.Name]
		if witness {
			blk = append(blk, Id("witness").Op(":=").Id("e").Dot("witness"+m.Name).Call(Id("t"), Id("c")))
		}
		if a.Effect != effectQuery {
			blk = append(blk, Id("before").Op(":=").Id("e").Dot("books").Call())
		}
		h := Id("_")
		if witness {
			h = Id("h")
		}
		blk = append(blk,
			List(h, Err()).Op(":=").Id("c").Dot("call").Call(Id("e")),
			Id("noSilentNoop").Call(Id("t"), Id("e"), Lit(c.Name), Lit(m.Name), Err()),
		)
		var ok []Code
		switch a.Effect {
		case effectConsumes:
			ok = append(ok, Id("e").Dot("expectConsumed").Call(Id("t"), Lit(m.Name), Id("before"), Id("want")))
		case effectRefunds:
			ok = append(ok, Id("e").Dot("expectRefunded").Call(Id("t"), Lit(m.Name), Id("before"), Id("want")))
		case effectNone:
			ok = append(ok, Id("e").Dot("expectConsumed").Call(Id("t"), Lit(m.Name), Id("before"), Lit(0)))
		}
		if witness {
			ok = append(ok, Id("witness").Call(Id("h")))
		}
		if len(ok) > 0 {
			blk = append(blk, If(Err().Op("==").Nil()).Block(ok...))
		}
		body = append(body, Block(blk...))
	}
	cg.add("invariant/"+invNoSilentNoop+"/"+c.Name, c, body...)
	return nil
}
