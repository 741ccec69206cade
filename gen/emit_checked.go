package gen

import (
	"bytes"
	"fmt"
	"go/format"
	"path"
	"sort"
	"strings"
	"unicode"

	. "github.com/dave/jennifer/jen"
)

// checkedEmitter writes the checked wrapper's package, and the contract's
// ChargeBook (which only the wrapper uses). Its runnable examples run over
// the fakes.
var checkedEmitter = &emitter{Name: "checked", Requires: []*emitter{contractEmitter, fakesEmitter}, Emit: noResult(emitChecked)}

func init() { register(checkedEmitter) }

// The checked package's entry points, which the wrapper's examples and memgen
// new's starting point (Skeleton) call.
const (
	checkedWrap       = "Wrap"       // wraps a mechanism
	checkedWithVerify = "WithVerify" // the option that turns on verify mode
)

// checkedLocals are the names the generated method bodies declare; a spec
// parameter with one of these names would be shadowed. The validator
// rejects them (badParamName); the check in emitChecked is its backstop.
var checkedLocals = []string{"au", "err", "m", "n", "ok", "op", "returned", "used0", "w"}

// Invariant enforcers the checked wrapper answers for (spec invariants[].enforced_by).
const (
	enforcerChecked = "checked-wrapper"
	enforcerVerify  = "checked-wrapper-verify"
)

type checkedGen struct {
	g    *generator
	s    *Spec
	used *method // the instance-wide physical-bytes query (UsedBytes), or nil
}

func (ck *checkedGen) file(name string) *File {
	return ck.g.File(ck.s.Packages.Checked+"/"+name, "")
}

func emitChecked(g *generator) error {
	s := g.Spec
	if s.Packages.Checked == "" {
		return nil
	}
	if s.roleInterface(roleGrant) == nil || s.roleInterface(roleAccount) == nil {
		return fmt.Errorf("the checked wrapper needs the grant and account interfaces")
	}
	ck := &checkedGen{g: g, s: s, used: usedQuery(s)}
	for _, c := range s.Capabilities {
		for _, m := range c.Methods {
			for _, p := range m.Params {
				if contains(checkedLocals, p.Name) {
					return fmt.Errorf("%s: %s.%s: parameter name %q collides with a local of the checked wrapper; rename it", m.Pos, c.Name, m.Name, p.Name)
				}
			}
			if m.Accounting.Effect != effectQuery && !m.ReturnsError() {
				return fmt.Errorf("%s: %s.%s: the checked wrapper needs every mutating method to return an error", m.Pos, c.Name, m.Name)
			}
			if len(ck.checks(m)) > 0 && !m.ReturnsError() {
				return fmt.Errorf("%s: %s.%s: has requires clauses but returns no error to report them", m.Pos, c.Name, m.Name)
			}
		}
	}
	ck.emitDoc()
	ck.emitWrap()
	if err := ck.emitStatic(); err != nil {
		return err
	}
	for _, c := range s.Capabilities {
		if err := ck.emitCapability(c); err != nil {
			return err
		}
	}
	return ck.emitExample()
}

// usedQuery finds the query of a required capability that takes nothing and
// returns the instance's physical bytes: verify mode reads it around every
// mutating call.
func usedQuery(s *Spec) *method {
	for _, c := range s.Capabilities {
		if !c.Required {
			continue
		}
		for _, m := range c.Methods {
			if m.Accounting.Effect == effectQuery && len(m.Params) == 0 && len(m.Returns) == 1 && m.Returns[0].Type == "Bytes" {
				return m
			}
		}
	}
	return nil
}

// capabilityOf returns the capability that declares m.
func (ck *checkedGen) capabilityOf(m *method) *capability {
	for _, c := range ck.s.Capabilities {
		for _, x := range c.Methods {
			if x == m {
				return c
			}
		}
	}
	return nil
}

// snake turns a Go name into a file name: VirtualBacking -> virtual_backing.
func snake(n string) string {
	var b strings.Builder
	for i, r := range n {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// capType is the unexported wrapper type of an optional capability.
func capType(c *capability) string { return lowerFirst(c.Name) }

// invariants returns the ids of the invariants the wrapper enforces for a kind
// of check: "consumes", "releases" or "verify".
func (ck *checkedGen) invariants(kind string) []string {
	var ids []string
	for _, iv := range ck.s.Invariants {
		switch kind {
		case "consumes":
			if iv.Applies.Consumes && contains(iv.EnforcedBy, enforcerChecked) {
				ids = append(ids, iv.ID)
			}
		case "releases":
			if iv.Applies.Releases && contains(iv.EnforcedBy, enforcerChecked) {
				ids = append(ids, iv.ID)
			}
		case "verify":
			if contains(iv.EnforcedBy, enforcerVerify) {
				ids = append(ids, iv.ID)
			}
		}
	}
	return ids
}

// fill wraps text at width columns, breaking between words; lines after the
// first start with indent. Generated doc comments read like hand-written ones.
func fill(text string, width int, indent string) string {
	var b strings.Builder
	col := 0
	for i, w := range strings.Fields(text) {
		switch {
		case i == 0:
		case col+1+len(w) > width:
			b.WriteString("\n" + indent)
			col = len(indent)
		default:
			b.WriteByte(' ')
			col++
		}
		b.WriteString(w)
		col += len(w)
	}
	return b.String()
}

func cite(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	return " [" + strings.Join(ids, ", ") + "]"
}

// --- expressions -----------------------------------------------------------

// expr returns the Go code of a spec expression (param, param.Field.Field;
// handle fields are read through their methods) and its spec type.
func (ck *checkedGen) expr(m *method, x *expr) (Code, string) {
	p := m.Param(x.Param)
	code := Id(x.Param)
	cur := p.Type
	for _, f := range x.Path {
		t := ck.s.Type(cur)
		fd := t.Field(f)
		if t.Kind == KindHandle {
			code = code.Dot(f).Call()
		} else {
			code = code.Dot(f)
		}
		cur = fd.Type
	}
	return code, cur
}

// check is one precondition of a method, in the order the wrapper runs it.
type check struct {
	pred string // live, within, aligned, positive, fits
	args []*expr
	text string // as the spec writes it; implicit live checks say why
}

// checks orders a method's preconditions: every handle the method reads is
// checked live first (the spec's live clauses, then the released handle, then
// any handle another clause or the amount reads through), shallow paths before
// deep ones; the other clauses follow in spec order.
func (ck *checkedGen) checks(m *method) []check {
	var live, rest []check
	seen := map[string]bool{}
	addLive := func(x *expr, text string) {
		if seen[x.Text] {
			return
		}
		seen[x.Text] = true
		live = append(live, check{pred: predLive, args: []*expr{x}, text: text})
	}
	for _, r := range m.Requires {
		if r.Pred == predLive {
			addLive(r.Args[0], r.Text)
		}
	}
	if m.Releases != "" {
		addLive(&expr{Param: m.Releases, Text: m.Releases}, "live("+m.Releases+"), released by "+m.Name)
	}
	base := func(x *expr) {
		if x == nil {
			return
		}
		if p := m.Param(x.Param); p != nil && ck.g.IsHandle(p.Type) && (len(x.Path) > 0 || x.Func != "") {
			addLive(&expr{Param: x.Param, Text: x.Param}, "live("+x.Param+"), read by "+x.Text)
		}
	}
	for _, r := range m.Requires {
		if r.Pred == predLive {
			continue
		}
		for _, a := range r.Args {
			base(a)
			if p := m.Param(a.Param); p != nil && ck.g.IsHandle(p.Type) && len(a.Path) == 0 {
				addLive(a, "live("+a.Text+"), read by "+r.Text)
			}
		}
		rest = append(rest, check{pred: r.Pred, args: r.Args, text: r.Text})
	}
	base(m.Accounting.Amount)
	sort.SliceStable(live, func(i, j int) bool { return len(live[i].args[0].Path) < len(live[j].args[0].Path) })
	return append(live, rest...)
}

// committedQuery of a handle param: the code reading it from inside a method
// of capability c, or nil when the handle type has no such query.
func (ck *checkedGen) committedCall(c *capability, x Code, handle string) Code {
	q := committedQuery(ck.s, handle)
	if q == nil {
		return nil
	}
	qc := ck.capabilityOf(q)
	switch {
	case qc == c && !c.Required:
		return Id("w").Dot("inner").Dot(q.Name).Call(x)
	case qc.Required:
		return Id("m").Dot("inner").Dot(q.Name).Call(x)
	}
	return Id("m").Dot("query" + q.Name).Call(x)
}

// --- package documentation -------------------------------------------------

func (ck *checkedGen) methodsWith(pred func(*method) bool) []string {
	var out []string
	for _, c := range ck.s.Capabilities {
		for _, m := range c.Methods {
			if pred(m) {
				out = append(out, c.Name+"."+m.Name)
			}
		}
	}
	return out
}

func (ck *checkedGen) invariantLine(iv *invariant, seen map[string]string) string {
	consuming := strings.Join(ck.methodsWith(func(m *method) bool { return m.Accounting.Effect == effectConsumes }), ", ")
	releasing := strings.Join(ck.methodsWith(func(m *method) bool { return m.Releases != "" }), ", ")
	var how []string
	if contains(iv.EnforcedBy, enforcerChecked) && iv.Applies.Consumes {
		how = append(how, "On "+consuming+": every precondition is checked first, then the grant must be non-nil (ErrNoGrant), issued by the wrapper's ledger (ErrForeignGrant) and of the mechanism's authority (ErrAuthorityMismatch); the declared amount, rounded up to the mechanism's granularity (ErrInvalidSize on overflow), is drawn from the grant before the mechanism is called, and undrawn when the call fails or panics. A rejected call draws nothing and calls nothing.")
	}
	if contains(iv.EnforcedBy, enforcerChecked) && iv.Applies.Releases {
		how = append(how, "On "+releasing+": the released handle (and every handle the call reads) is checked with memapi.CheckHandle against the mechanism's instance before the call: nil is ErrNilHandle, another instance's handle is ErrForeignHandle, a released one is ErrReleased; the mechanism is not called.")
	}
	if contains(iv.EnforcedBy, enforcerVerify) {
		how = append(how, "In verify mode (WithVerify) the wrapper reads the mechanism's own counters around every mutating call and returns ErrUntruthful when they did not move by exactly the rounded amount the spec declares: the check that catches an eager mechanism whose commit is a successful no-op.")
	}
	if len(how) == 0 {
		return ""
	}
	text := strings.Join(how, "\n    ")
	if first, ok := seen[text]; ok {
		text = "By the same checks as " + first + ": a call rejected by a check draws nothing and calls nothing, and a call the mechanism fails gives its draw back."
	} else {
		seen[text] = iv.ID
	}
	return "  - " + fill(iv.ID+": "+iv.Says, 74, "    ") + "\n    " + fill(text, 78, "    ")
}

func (ck *checkedGen) emitDoc() {
	f := ck.file("doc.go")
	s := ck.s
	var inv []string
	seen := map[string]string{}
	for _, iv := range s.Invariants {
		if l := ck.invariantLine(iv, seen); l != "" {
			inv = append(inv, l)
		}
	}
	var table []string
	for _, c := range s.Capabilities {
		for _, m := range c.Methods {
			notes := ck.methodNotes(c, m)
			if len(notes) == 0 {
				continue
			}
			table = append(table, "  - "+fill(c.Name+"."+m.Name+": "+strings.Join(notes, "; ")+".", 74, "    "))
		}
	}
	doc := `Package checked wraps any memapi.Mechanism in a layer that enforces the
spec's invariants on every call. It is generated from ` + s.File + `:
each method's checks follow from its accounting effect, the handle it creates
or releases, and its requires clauses.

	m := checked.Wrap(mech, gov.Ledger())                        // checks, and the ledger
	m := checked.Wrap(mech, gov.Ledger(), checked.WithVerify())  // also truthfulness, for tests

where gov.Ledger() is the Ledger whose grants and accounts the wrapper
accepts (the governor's); a grant or account it did not issue is rejected with
ErrForeignGrant.

The wrapper is where the ledger moves: mechanisms never draw from grants nor
refund to accounts. A consuming call draws its rounded amount from the grant
before the mechanism runs and undraws it when the mechanism fails; a refunding
call refunds the account after the mechanism really released the memory.
When the mechanism panics (or ends its goroutine) inside a consuming call,
the draw is given back and the panic goes on to the caller unrecovered.

Every check runs before the mechanism is called and before anything is drawn,
so a rejected call returns an *memapi.Error whose Kind is the sentinel
(errors.Is and errors.As both work) and changes nothing: neither the
mechanism nor the ledger. Errors of the mechanism and of the ledger (Draw,
Undraw, Refund) are returned as they are, joined when both fail.

Invariants enforced (ids from the spec):

` + strings.Join(inv, "\n\n") + `

Checks per method, in the order they run (the spec's requires clauses, with
the error each returns):

` + strings.Join(table, "\n") + `

Refund amounts are known before the mechanism is called: a handle's size, a
range's rounded length or, for committed(res), the committed bytes the
wrapper charged against res (what Commit drew less what Decommit refunded),
which it keeps in the handle through memapi.ChargeBook instead of asking the
mechanism; bytes committed past the wrapper were never charged and are not
refunded. A refunding call needs an account of
the wrapper's ledger and the mechanism's authority (ErrNoAccount,
ErrForeignGrant, ErrAuthorityMismatch). When the
mechanism released the memory but the account's Refund failed, the account's
error is returned: the handle is released all the same.

Verify mode: mutating calls are serialized through the wrapper so the figures
read around each call are exact. Before and after the call the wrapper reads
the committed bytes of every reservation-like handle the call touches (the
primary figure when there is one) and the instance's used bytes; after
success they must have moved by exactly the declared rounded amount (up for
consuming calls, down for refunding ones, not at all for the others), and
after a failure not at all. A created handle must be live, of this instance,
and as large as the amount charged; a released handle must be released after
success and still live after failure. On a mismatch the call returns an
*memapi.Error of kind ErrUntruthful (Wanted: the declared movement,
Available: the observed one), joined with the mechanism's own error, and the
ledger follows what really happened when the figures agree with each other:
the draw is adjusted to their observed growth (a commit that installed
nothing is undrawn entirely; one that installed more draws the excess, which
the grant may refuse), and a refund is capped at the observed release. When
the figures disagree the truth is unknown and the ledger keeps the declared
outcome. Created handles are returned with the error, so nothing they hold
is lost. A figure misreported by a constant offset moves correctly and is
not caught here; the conformance suite checks absolute values.

Negotiation: the wrapper offers exactly the capabilities of the mechanism it
wraps, asked anew on each accessor call, so memapi.Negotiate(Wrap(m)) equals
memapi.Negotiate(m). Info returns the wrapped mechanism's Info: the wrapper
is not a new instance, and handles are the mechanism's own.

Cost: the wrapper keeps no per-call state (only its options and, for each
optional capability, a cached wrapper). Outside verify mode a call adds a few
comparisons, one ledger check, one Authority call and the Draw or Refund, and
allocates nothing unless it fails.`
	f.PackageComment(doc)
	comment(f, "specDigest is the sha256 of the spec this package was generated from.")
	f.Const().Id("specDigest").Op("=").Lit(s.Digest)
	comment(f, "The tripwire: this fails to compile (duplicate map key) when the contract\npackage was generated from another spec than this one. Run go generate ./...")
	f.Func().Id("_").Params().Block(
		Id("_").Op("=").Map(Bool()).Int().Values(Dict{
			False(): Lit(0),
			ck.g.C(contractSpecDigest).Op("==").Id("specDigest"): Lit(1),
		}),
	)
}

// methodNotes describes the checks of a wrapper method, for docs.
func (ck *checkedGen) methodNotes(c *capability, m *method) []string {
	var notes []string
	for _, k := range ck.checks(m) {
		switch k.pred {
		case predLive:
			ids := ""
			if m.Releases != "" && k.args[0].Text == m.Releases {
				ids = cite(ck.invariants("releases"))
			}
			notes = append(notes, k.text+" (ErrNilHandle, ErrForeignHandle, ErrReleased)"+ids)
		case predWithin:
			notes = append(notes, k.text+" (ErrInvalidRange)")
		case predAligned:
			notes = append(notes, k.text+" to Info().Granularity (ErrUnaligned)")
		case predPositive:
			notes = append(notes, k.text+" (ErrInvalidSize)")
		case predFits:
			notes = append(notes, k.text+": length equals the handle's size (ErrInvalidRange)")
		}
	}
	a := m.Accounting
	switch a.Effect {
	case effectConsumes:
		notes = append(notes, "draws "+a.Amount.Text+" rounded to "+roundField(a.Round)+" from "+a.Account+" (ErrNoGrant, ErrForeignGrant, ErrAuthorityMismatch, ErrInvalidSize)"+cite(ck.invariants("consumes")))
	case effectRefunds:
		notes = append(notes, "refunds "+a.Amount.Text+" to "+a.Account+" after success (ErrNoAccount, ErrForeignGrant, ErrAuthorityMismatch)")
	}
	if a.Effect != effectQuery {
		notes = append(notes, "verify mode checks the figures"+cite(ck.invariants("verify")))
	}
	return notes
}

// roundField names the MechanismInfo field an amount is rounded to.
func roundField(r string) string {
	switch r {
	case roundAlloc:
		return "Info().AllocGranularity"
	case roundGranularity:
		return "Info().Granularity"
	}
	return "nothing"
}

// --- Wrap, options, accessors ----------------------------------------------

// emitWrap writes wrap.go: the Ledger the wrapper takes grants and accounts
// from, the options, Wrap itself, the wrapper type with its accessors, and
// the committed-bytes queries a method reads of another capability.
func (ck *checkedGen) emitWrap() {
	f := ck.file("wrap.go")
	ck.emitLedger(f)
	ck.emitOptions(f)
	ck.emitWrapFunc(f)
	ck.emitMechanism(f)
	ck.emitCrossQueries(f)
}

// emitLedger writes the Ledger interface and the ledgers the package offers:
// NoLedger, Ledgers (any of several) and allLedgers (both of two, for a
// rewrap).
func (ck *checkedGen) emitLedger(f *File) {
	c := ck.g.C
	// The contract's interfaces of the grant and account roles, by the
	// spec's names; the Ledger's methods are named after the roles.
	grant, account := roleName(ck.s, roleGrant), roleName(ck.s, roleAccount)
	role := map[string]string{"Grant": grant, "Account": account}

	comment(f, `Ledger is where the grants and accounts a wrapper accepts come from. A
consuming call's grant and a refunding call's account must be vouched for by
the ledger the wrapper was built with, as a handle must have been made by the
wrapped instance: a grant of any other origin (forged, or issued by another
ledger) draws nothing the ledger sees, so the wrapper rejects it with
ErrForeignGrant and calls nothing. A ledger vouches only for values it made
itself, recognised by their concrete type and their link back to it, never by
what the value says about itself. The methods are called on every consuming
and refunding call and must be cheap and safe for concurrent use.`)
	f.Type().Id("Ledger").Interface(
		Comment("IssuedGrant reports whether g was issued by this ledger, and the authority\nit draws on, as the ledger booked it."),
		Id("IssuedGrant").Params(Id("g").Add(c(grant))).Params(c("AuthorityID"), Bool()),
		Comment("IssuedAccount reports whether a is an account of this ledger, and the\nauthority it refunds to, as the ledger booked it."),
		Id("IssuedAccount").Params(Id("a").Add(c(account))).Params(c("AuthorityID"), Bool()),
	)
	comment(f, `NoLedger vouches for nothing. A wrapper built with it answers queries and
checks handles, and rejects every consuming and refunding call with
ErrForeignGrant: the wrapper to hand out for inspection.`)
	f.Var().Id("NoLedger").Id("Ledger").Op("=").Id("noLedger").Values()
	f.Type().Id("noLedger").Struct()
	f.Func().Params(Id("noLedger")).Id("IssuedGrant").Params(c(grant)).Params(c("AuthorityID"), Bool()).Block(Return(Lit(""), False()))
	f.Func().Params(Id("noLedger")).Id("IssuedAccount").Params(c(account)).Params(c("AuthorityID"), Bool()).Block(Return(Lit(""), False()))
	comment(f, `Ledgers returns a Ledger that vouches for what any of ls vouches for: a
wrapper that takes the grants of several ledgers.`)
	f.Func().Id("Ledgers").Params(Id("ls").Op("...").Id("Ledger")).Id("Ledger").Block(
		Return(Id("anyLedger").Call(Qual("slices", "Clone").Call(Id("ls")))),
	)
	f.Type().Id("anyLedger").Index().Id("Ledger")
	for _, kind := range []string{"Grant", "Account"} {
		arg := map[string]string{"Grant": "g", "Account": "a"}[kind]
		f.Func().Params(Id("ls").Id("anyLedger")).Id("Issued"+kind).Params(Id(arg).Add(c(role[kind]))).Params(c("AuthorityID"), Bool()).Block(
			For(List(Id("_"), Id("l")).Op(":=").Range().Id("ls")).Block(
				If(Id("l").Op("==").Nil()).Block(Continue()),
				If(List(Id("auth"), Id("ok")).Op(":=").Id("l").Dot("Issued"+kind).Call(Id(arg)), Id("ok")).Block(Return(Id("auth"), True())),
			),
			Return(Lit(""), False()),
		)
	}
	comment(f, `allLedgers vouches for what both of its ledgers vouch for, on the same
authority: the ledger of a rewrapped wrapper.`)
	f.Type().Id("allLedgers").Index(Lit(2)).Id("Ledger")
	for _, kind := range []string{"Grant", "Account"} {
		arg := map[string]string{"Grant": "g", "Account": "a"}[kind]
		f.Func().Params(Id("ls").Id("allLedgers")).Id("Issued"+kind).Params(Id(arg).Add(c(role[kind]))).Params(c("AuthorityID"), Bool()).Block(
			List(Id("a0"), Id("ok0")).Op(":=").Id("ls").Index(Lit(0)).Dot("Issued"+kind).Call(Id(arg)),
			List(Id("a1"), Id("ok1")).Op(":=").Id("ls").Index(Lit(1)).Dot("Issued"+kind).Call(Id(arg)),
			Return(Id("a0"), Id("ok0").Op("&&").Id("ok1").Op("&&").Id("a0").Op("==").Id("a1")),
		)
	}
}

// emitOptions writes Option and WithVerify.
func (ck *checkedGen) emitOptions(f *File) {
	comment(f, "Option configures Wrap.")
	f.Type().Id("Option").Func().Params(Op("*").Id("options"))
	f.Type().Id("options").Struct(Id("verify").Bool())
	comment(f, `WithVerify turns on verify mode: around every mutating call the wrapper reads
the mechanism's committed and used bytes and returns ErrUntruthful when they
did not move by exactly the rounded amount the spec declares`+cite(ck.invariants("verify"))+`.
Mutating calls through the wrapper are then serialized. Meant for tests and
for qualifying a new mechanism; it costs two to four queries per call.`)
	f.Func().Id(checkedWithVerify).Params().Id("Option").Block(
		Return(Func().Params(Id("o").Op("*").Id("options")).Block(Id("o").Dot("verify").Op("=").True())),
	)
}

// optional returns the spec's optional capabilities.
func (ck *checkedGen) optional() []*capability {
	var optional []*capability
	for _, cp := range ck.s.Capabilities {
		if !cp.Required {
			optional = append(optional, cp)
		}
	}
	return optional
}

// emitWrapFunc writes Wrap, with the invariants it enforces in its doc, and
// Verifying.
func (ck *checkedGen) emitWrapFunc(f *File) {
	c := ck.g.C
	ids := func(kind, fallback string) string {
		if v := ck.invariants(kind); len(v) > 0 {
			return strings.Join(v, ", ")
		}
		return fallback
	}
	comment(f, `Wrap returns m with the spec's invariants enforced on every call (see the
package documentation for the full list, per method):
  - `+ids("consumes", "charging")+`: consuming calls draw their rounded
    amount from a grant of l and of m's authority before m runs, and undraw
    it when m fails or panics; a call rejected by a check draws nothing;
  - `+ids("releases", "handles")+`: handles are checked against m's instance
    before m runs; another instance's handle, a released handle or nil is
    rejected with a typed error and m is not called;
  - ranges (requires clauses): within, aligned and fits are checked against
    the handle's size and m's granularity;
  - refunds: refunding calls refund their account, which must be l's and of
    m's authority, after m released the memory;
  - `+ids("verify", "verify mode")+` (WithVerify): m's counters must move by
    exactly the declared amount.

The result offers exactly the capabilities m offers (memapi.Negotiate(Wrap(m))
== memapi.Negotiate(m)) and its Info is m's Info. Wrap reads m.Info() once:
a mechanism's instance, authority and granularities are fixed for its life.
Grants and accounts are accepted only when l vouches for them: any other is
rejected with ErrForeignGrant before anything is drawn or called. Wrapping a
wrapper does not stack the checks (that would draw twice): it rewraps the same
mechanism with the options of both and accepts only what both ledgers vouch
for, so a rewrap never trusts more than the wrapper it was given. Wrap panics
when m or l is nil.`)
	f.Func().Id(checkedWrap).Params(Id("m").Add(c(contractMechanism)), Id("l").Id("Ledger"), Id("opts").Op("...").Id("Option")).Add(c(contractMechanism)).Block(
		If(Id("m").Op("==").Nil()).Block(Panic(Lit("checked: Wrap of a nil Mechanism"))),
		If(Id("l").Op("==").Nil()).Block(Panic(Lit("checked: Wrap without a Ledger (use NoLedger for a wrapper that takes no grant)"))),
		Var().Id("o").Id("options"),
		If(List(Id("w"), Id("ok")).Op(":=").Id("m").Assert(Op("*").Id("mechanism")), Id("ok")).Block(
			List(Id("m"), Id("o").Dot("verify")).Op("=").List(Id("w").Dot("inner"), Id("w").Dot("verify")),
			Id("l").Op("=").Id("allLedgers").Values(Id("w").Dot("ledger"), Id("l")),
		),
		For(List(Id("_"), Id("opt")).Op(":=").Range().Id("opts")).Block(
			If(Id("opt").Op("!=").Nil()).Block(Id("opt").Call(Op("&").Id("o"))),
		),
		Return(Op("&").Id("mechanism").Values(Dict{
			Id("inner"):  Id("m"),
			Id("info"):   Id("m").Dot("Info").Call(),
			Id("ledger"): Id("l"),
			Id("verify"): Id("o").Dot("verify"),
		})),
	)
	comment(f, "Verifying reports whether m is a checked wrapper in verify mode.")
	f.Func().Id("Verifying").Params(Id("m").Add(c(contractMechanism))).Bool().Block(
		List(Id("w"), Id("ok")).Op(":=").Id("m").Assert(Op("*").Id("mechanism")),
		Return(Id("ok").Op("&&").Id("w").Dot("verify")),
	)
}

// emitMechanism writes the wrapper type, Unwrap, and the accessors of the
// optional capabilities, each wrapper cached.
func (ck *checkedGen) emitMechanism(f *File) {
	c := ck.g.C
	optional := ck.optional()
	comment(f, `mechanism is the checked wrapper. It implements the required capabilities
itself; each optional capability has its own wrapper type, cached so that an
accessor call allocates nothing while the mechanism keeps returning the same
capability value.`)
	f.Type().Id("mechanism").StructFunc(func(b *Group) {
		b.Id("inner").Add(c(contractMechanism))
		b.Id("info").Add(c("MechanismInfo")).Comment("read once by Wrap")
		b.Id("ledger").Id("Ledger").Comment("vouches for the grants and accounts the wrapper accepts")
		b.Id("verify").Bool()
		b.Id("mu").Qual("sync", "Mutex").Comment("verify mode: serializes mutating calls so before/after figures are exact")
		for _, cp := range optional {
			b.Id(capType(cp)).Qual("sync/atomic", "Pointer").Types(Id(capType(cp)))
		}
	})
	f.Var().Id("_").Add(c(contractMechanism)).Op("=").Parens(Op("*").Id("mechanism")).Parens(Nil())
	comment(f, `Unwrap returns the mechanism the wrapper wraps. Calls made on it bypass
every check: it is for tools that identify the mechanism beneath (the
conformance suite finds a wrapped mechanism's spec entry by the package of
its type), never for memory operations.`)
	f.Func().Params(Id("m").Op("*").Id("mechanism")).Id("Unwrap").Params().Add(c(contractMechanism)).Block(
		Return(Id("m").Dot("inner")),
	)
	for _, cp := range optional {
		comment(f, accessor(cp)+" returns the checked "+cp.Name+" when the wrapped mechanism offers it\nnow, and nil and false when it does not: never more than the mechanism offers.")
		f.Func().Params(Id("m").Op("*").Id("mechanism")).Id(accessor(cp)).Params().Params(c(cp.Name), Bool()).Block(
			List(Id("in"), Id("ok")).Op(":=").Id("m").Dot("inner").Dot(accessor(cp)).Call(),
			If(Op("!").Id("ok").Op("||").Id("in").Op("==").Nil()).Block(Return(Nil(), False())),
			If(Id("w").Op(":=").Id("m").Dot(capType(cp)).Dot("Load").Call(), Id("w").Op("!=").Nil().Op("&&").Id("sameValue").Call(Id("w").Dot("inner"), Id("in"))).Block(
				Return(Id("w"), True()),
			),
			Id("w").Op(":=").Op("&").Id(capType(cp)).Values(Dict{Id("m"): Id("m"), Id("inner"): Id("in")}),
			Id("m").Dot(capType(cp)).Dot("Store").Call(Id("w")),
			Return(Id("w"), True()),
		)
	}
	comment(f, "sameValue reports whether two capability values are the same, without\npanicking on values of an incomparable dynamic type.")
	f.Func().Id("sameValue").Params(Id("a"), Id("b").Any()).Bool().Block(
		Id("t").Op(":=").Qual("reflect", "TypeOf").Call(Id("a")),
		Return(Id("t").Op("==").Qual("reflect", "TypeOf").Call(Id("b")).Op("&&").Id("t").Op("!=").Nil().Op("&&").Id("t").Dot("Comparable").Call().Op("&&").Id("a").Op("==").Id("b")),
	)
}

// emitCrossQueries writes, for a method of one capability that reads the
// committed bytes of a handle through another, optional capability, the
// query that reaches it.
func (ck *checkedGen) emitCrossQueries(f *File) {
	g, s, c := ck.g, ck.s, ck.g.C
	done := map[string]bool{}
	for _, h := range s.handles() {
		q := committedQuery(s, h.Name)
		if q == nil || done[q.Name] {
			continue
		}
		done[q.Name] = true
		qc := ck.capabilityOf(q)
		if qc.Required || !ck.queryNeededElsewhere(q, qc) {
			continue
		}
		comment(f, "query"+q.Name+" reads "+qc.Name+"."+q.Name+" for a method of another capability.")
		f.Func().Params(Id("m").Op("*").Id("mechanism")).Id("query"+q.Name).Params(Id("h").Add(g.Type(h.Name))).Params(c("Bytes"), Error()).Block(
			List(Id("c"), Id("ok")).Op(":=").Id("m").Dot("inner").Dot(accessor(qc)).Call(),
			If(Op("!").Id("ok").Op("||").Id("c").Op("==").Nil()).Block(
				Return(Lit(0), Op("&").Add(c(contractError)).Values(Dict{
					Id("Op"): Lit(qc.Name + "." + q.Name), Id("Kind"): c("ErrUnsupported"), Id("Mechanism"): Id("m").Dot("info").Dot("Mechanism"),
					Id("Detail"): Lit("mechanism no longer offers " + qc.Name),
				})),
			),
			Return(Id("c").Dot(q.Name).Call(Id("h"))),
		)
	}
}

// queryNeededElsewhere reports whether a method outside qc reads q.
func (ck *checkedGen) queryNeededElsewhere(q *method, qc *capability) bool {
	for _, c := range ck.s.Capabilities {
		if c == qc {
			continue
		}
		for _, m := range c.Methods {
			if m.Accounting.Effect == effectQuery {
				continue
			}
			for _, p := range m.Params {
				if p.Type == q.Params[0].Type {
					return true
				}
			}
		}
	}
	return false
}

// --- the parts that do not vary with the spec --------------------------------

// emitStatic copies the parts of the wrapper that do not vary with the spec,
// plain Go in checkedtmpl (the grant and account checks, verify mode's
// audit), into the checked package, and the contract's ChargeBook
// (contracttmpl: the one place, in each handle, where the wrapper keeps the
// committed bytes it charged; it lives in the contract package because only
// that package reaches a handle's header) into the contract package.
func (ck *checkedGen) emitStatic() error {
	for _, d := range []struct{ pattern, dir, pkg string }{
		{"checkedtmpl/*.go", ck.s.Packages.Checked, path.Base(ck.s.Packages.Checked)},
		{"contracttmpl/charge_book.go", ck.s.Packages.Contract, "memapi"},
	} {
		tmpls, err := ck.g.renderTemplates(templates, d.pattern, d.pkg)
		if err != nil {
			return err
		}
		for _, t := range tmpls {
			ck.g.Raw(d.dir+"/"+t.name, t.src)
		}
	}
	return nil
}

// --- capabilities ----------------------------------------------------------

func (ck *checkedGen) emitCapability(c *capability) error {
	f := ck.file(snake(c.Name) + ".go")
	g := ck.g
	if !c.Required {
		comment(f, capType(c)+" is the checked "+c.Name+" of a wrapped mechanism.")
		f.Type().Id(capType(c)).Struct(
			Id("m").Op("*").Id("mechanism"),
			Id("inner").Add(g.C(c.Name)),
		)
		f.Var().Id("_").Add(g.C(c.Name)).Op("=").Parens(Op("*").Id(capType(c))).Parens(Nil())
	}
	for _, m := range c.Methods {
		if err := ck.emitMethod(f, c, m); err != nil {
			return err
		}
	}
	return nil
}

// methodCtx is one wrapper method being generated.
type methodCtx struct {
	ck *checkedGen
	c  *capability
	m  *method
	// errDeclared records that the body declared err at function scope.
	errDeclared bool
}

func (x *methodCtx) recv() *Statement {
	if x.c.Required {
		return Id("m").Op("*").Id("mechanism")
	}
	return Id("w").Op("*").Id(capType(x.c))
}

// declare returns the assignment operator for a statement that (re)assigns
// err and declares the other names on its left: := unless err is the only
// name and already declared.
func (x *methodCtx) declare(others int) string {
	if others == 0 && x.errDeclared {
		return "="
	}
	x.errDeclared = true
	return ":="
}

// inner is the wrapped capability.
func (x *methodCtx) inner() *Statement {
	if x.c.Required {
		return Id("m").Dot("inner")
	}
	return Id("w").Dot("inner")
}

func (x *methodCtx) args() []Code {
	var a []Code
	for _, p := range x.m.Params {
		a = append(a, Id(p.Name))
	}
	return a
}

// fail returns the zero results with err as the error.
func (x *methodCtx) fail(err Code) *Statement {
	var rs []Code
	for _, r := range x.m.Returns[:len(x.m.Returns)-1] {
		rs = append(rs, x.ck.g.Zero(r.Type))
	}
	return Return(append(rs, err)...)
}

// outs names the results of the inner call; the last is err.
func (x *methodCtx) outs() []Code {
	var o []Code
	for i := range x.m.Returns[:len(x.m.Returns)-1] {
		o = append(o, Id(fmt.Sprintf("out%d", i)))
	}
	return append(o, Id("err"))
}

func (ck *checkedGen) emitMethod(f *File, c *capability, m *method) error {
	g := ck.g
	params, results := g.Signature(m)
	x := &methodCtx{ck: ck, c: c, m: m}
	notes := ck.methodNotes(c, m)
	doc := m.Name + " calls the wrapped mechanism's " + m.Name + "."
	if len(notes) > 0 {
		doc = m.Name + " checks " + strings.Join(notes, "; ") + "; then it calls the wrapped mechanism's " + m.Name + "."
	}
	comment(f, fill(doc, 77, ""))
	mutating := m.Accounting.Effect != effectQuery
	if n := len(x.figureParams()) + 1; mutating && n > auditFigures {
		return fmt.Errorf("%s: %s.%s: verify mode reads %d figures around the call, more than the %d it has room for", m.Pos, c.Name, m.Name, n, auditFigures)
	}
	f.Func().Params(x.recv()).Id(m.Name).Params(params...).Params(results...).BlockFunc(func(b *Group) {
		if !c.Required && (mutating || len(ck.checks(m)) > 0) {
			b.Id("m").Op(":=").Id("w").Dot("m")
		}
		if mutating {
			b.If(Id("m").Dot("verify")).Block(
				Comment("Verify mode serializes mutating calls, so the figures read around this one are exact."),
				Id("m").Dot("mu").Dot("Lock").Call(),
				Defer().Id("m").Dot("mu").Dot("Unlock").Call(),
			)
		}
		x.body(b)
	})
	return nil
}

// auditFigures is how many figures verify mode can read around one call: the
// length of audit.before in checkedtmpl/audit.go (TestAuditFiguresMatchTemplate).
const auditFigures = 4

// unit is the granularity an amount is rounded to.
func unit(round string) Code {
	switch round {
	case roundAlloc:
		return Id("m").Dot("info").Dot("AllocGranularity")
	case roundGranularity:
		return Id("m").Dot("info").Dot("Granularity")
	}
	return Lit(0)
}

// figureParams are the handle params whose committed bytes verify mode reads:
// those the call does not release, whose type has a committed-bytes query.
func (x *methodCtx) figureParams() []*param {
	var ps []*param
	for _, p := range x.m.Params {
		if p.Name != x.m.Releases && x.ck.g.IsHandle(p.Type) && committedQuery(x.ck.s, p.Type) != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// bookParams are the handles whose committed bytes the call moves by its
// amount: the reservation-like params (with a committed-bytes query) of a
// consuming or refunding call that creates and releases none of them, such as
// Commit and Decommit of res. The wrapper books what it charged against them
// (memapi.ChargeBook), so a later refund of committed(h) needs no query.
func (x *methodCtx) bookParams() []*param {
	a := x.m.Accounting
	if (a.Effect != effectConsumes && a.Effect != effectRefunds) || x.m.Creates != "" || a.Amount.Func == "committed" {
		return nil
	}
	return x.figureParams()
}

// body writes a wrapper method's body: its checks, the ledger side before
// the call, verify mode's figures before, the call, verify mode's audit of
// the figures after, and the ledger side after.
func (x *methodCtx) body(b *Group) {
	ck, m := x.ck, x.m
	a := m.Accounting
	checks := ck.checks(m)
	if len(checks) > 0 || a.Effect != effectQuery {
		b.Const().Id("op").Op("=").Lit(x.c.Name + "." + m.Name)
	}
	for _, k := range checks {
		x.check(b, k)
	}
	x.ledgerBefore(b)
	call := x.inner().Dot(m.Name).Call(x.args()...)
	if a.Effect == effectQuery {
		b.Return(call)
		return
	}
	outs := x.outs()
	head := outs[: len(outs)-1 : len(outs)-1]
	x.figuresBefore(b)
	b.List(outs...).Op(x.declare(len(outs) - 1)).Add(call)
	if a.Effect == effectConsumes {
		b.Id("returned").Op("=").True()
	}
	x.audit(b, head)
	x.ledgerAfter(b, outs, head)
}

// ledgerBefore writes the ledger side before the call: a consuming call
// draws its rounded amount (undrawn by a deferred abandon unless the call
// returns), a refunding one checks its account and computes its amount.
func (x *methodCtx) ledgerBefore(b *Group) {
	ck, m := x.ck, x.m
	a := m.Accounting
	switch a.Effect {
	case effectConsumes:
		amt, _ := ck.expr(m, a.Amount)
		b.List(Id("n"), Id("err")).Op(x.declare(1)).Id("m").Dot("charge").Call(Id("op"), Id(a.Account), amt, unit(a.Round))
		b.If(Id("err").Op("!=").Nil()).Block(x.fail(Id("err")))
		b.Id("returned").Op(":=").False()
		b.Defer().Id("m").Dot("abandon").Call(Id(a.Account), Id("n"), Op("&").Id("returned"))
	case effectRefunds:
		b.If(Id("err").Op(":=").Id("m").Dot("account").Call(Id("op"), Id(a.Account)), Id("err").Op("!=").Nil()).Block(x.fail(Id("err")))
		switch {
		case a.Amount.Func == "committed":
			b.Id("n").Op(":=").Id("book").Dot("Charged").Call(Id(a.Amount.Param))
		case a.Round == roundNone || a.Round == "":
			amt, _ := ck.expr(m, a.Amount)
			b.Id("n").Op(":=").Add(amt)
		default:
			amt, _ := ck.expr(m, a.Amount)
			b.List(Id("n"), Id("err")).Op(x.declare(1)).Id("m").Dot("round").Call(Id("op"), amt, unit(a.Round))
			b.If(Id("err").Op("!=").Nil()).Block(x.fail(Id("err")))
		}
	}
}

// figuresBefore writes verify mode's reading, before the call, of the
// committed bytes of every handle the call touches and of the instance's
// used bytes.
func (x *methodCtx) figuresBefore(b *Group) {
	ck, a := x.ck, x.m.Accounting
	amount := Code(Lit(0))
	if a.Effect == effectConsumes || a.Effect == effectRefunds {
		amount = Id("n")
	}
	effect := ck.g.C(effectConst(a.Effect))
	figs := x.figureParams()
	b.Var().Id("au").Id("audit")
	b.If(Id("m").Dot("verify")).BlockFunc(func(v *Group) {
		v.Id("au").Op("=").Id("audit").Values(Dict{
			Id("m"): Id("m"), Id("op"): Id("op"), Id("effect"): effect, Id("amount"): amount,
		})
		for i, p := range figs {
			v.List(Id("au").Dot("before").Index(Lit(i)), Id("au").Dot("beforeErr").Index(Lit(i))).Op("=").Add(ck.committedCall(x.c, Id(p.Name), p.Type))
		}
		if ck.used != nil {
			v.Id("au").Dot("before").Index(Lit(len(figs))).Op("=").Id("m").Dot("inner").Dot(ck.used.Name).Call()
		}
	})
}

// audit writes verify mode's side after the call: the figures read again
// and compared, the created and released handles checked, and the ledger
// settled on what the figures show; head are the results before err.
func (x *methodCtx) audit(b *Group, head []Code) {
	ck, m := x.ck, x.m
	a := m.Accounting
	figs := x.figureParams()
	b.If(Id("m").Dot("verify")).BlockFunc(func(v *Group) {
		v.Id("au").Dot("err").Op("=").Id("err")
		for i, p := range figs {
			q := committedQuery(ck.s, p.Type)
			name := ck.capabilityOf(q).Name + "." + q.Name + "(" + p.Name + ")"
			after, aerr := fmt.Sprintf("c%d", i), fmt.Sprintf("c%dErr", i)
			v.List(Id(after), Id(aerr)).Op(":=").Add(ck.committedCall(x.c, Id(p.Name), p.Type))
			v.Id("au").Dot("figure").Call(Lit(i), Lit(name), Id(after), Id(aerr))
		}
		if ck.used != nil {
			name := ck.capabilityOf(ck.used).Name + "." + ck.used.Name + "()"
			v.Id("au").Dot("figure").Call(Lit(len(figs)), Lit(name), Id("m").Dot("inner").Dot(ck.used.Name).Call(), Nil())
		}
		if m.Creates != "" {
			v.Id("au").Dot("created").Call(Id("out0"))
			if t := ck.s.Type(m.Creates); t.hasField("Size") && a.Effect == effectConsumes {
				v.If(Id("out0").Op("!=").Nil()).Block(Id("au").Dot("size").Call(Lit(m.Creates+".Size()"), Id("out0").Dot("Size").Call()))
			}
		}
		if m.Releases != "" {
			v.Id("au").Dot("released").Call(Lit(m.Releases), Id(m.Releases))
		}
		x.settle(v)
		v.Return(append(head, Id("err"))...)
	})
}

// settle writes how verify mode settles the ledger on the observed figures:
// the draw or the refund adjusted, and the charge book moved by what was
// settled.
func (x *methodCtx) settle(v *Group) {
	a := x.m.Accounting
	switch a.Effect {
	case effectConsumes:
		v.Id("err").Op("=").Id("au").Dot("settleDraw").Call(Id(a.Account), Id("n"))
		for _, p := range x.bookParams() {
			v.Id("book").Dot("Add").Call(Id(p.Name), Id("au").Dot("settled"))
		}
	case effectRefunds:
		v.Id("err").Op("=").Id("au").Dot("settleRefund").Call(Id(a.Account), Id("n"))
		for _, p := range x.bookParams() {
			v.Id("book").Dot("Sub").Call(Id(p.Name), Id("au").Dot("settled"))
		}
		if a.Amount.Func == "committed" {
			v.If(Id("au").Dot("err").Op("==").Nil()).Block(Id("book").Dot("Clear").Call(Id(a.Amount.Param)))
		}
	default:
		v.Id("err").Op("=").Id("au").Dot("result").Call()
	}
}

// ledgerAfter writes the ledger side after the call outside verify mode: a
// failed consuming call undraws, a successful one books its charge; a
// successful refunding call unbooks and refunds.
func (x *methodCtx) ledgerAfter(b *Group, outs, head []Code) {
	a := x.m.Accounting
	switch a.Effect {
	case effectConsumes:
		b.If(Id("err").Op("!=").Nil()).Block(Return(append(head, Id("m").Dot("undraw").Call(Id(a.Account), Id("n"), Id("err")))...))
		for _, p := range x.bookParams() {
			b.Id("book").Dot("Add").Call(Id(p.Name), Id("n"))
		}
		b.Return(append(head, Nil())...)
	case effectRefunds:
		b.If(Id("err").Op("!=").Nil()).Block(Return(outs...))
		for _, p := range x.bookParams() {
			b.Id("book").Dot("Sub").Call(Id(p.Name), Id("n"))
		}
		if a.Amount.Func == "committed" {
			b.Id("book").Dot("Clear").Call(Id(a.Amount.Param))
		}
		b.Return(append(head, Id("refund").Call(Id(a.Account), Id("n")))...)
	default:
		b.Return(outs...)
	}
}

// check emits one precondition.
func (x *methodCtx) check(b *Group, k check) {
	ck, m := x.ck, x.m
	switch k.pred {
	case predLive:
		h, _ := ck.expr(m, k.args[0])
		b.If(Id("err").Op(":=").Add(ck.g.C(contractCheckHandle)).Call(Id("op"), h, Id("m").Dot("info").Dot("Instance")), Id("err").Op("!=").Nil()).Block(x.fail(Id("err")))
	case predPositive:
		v, _ := ck.expr(m, k.args[0])
		b.If(Add(v).Op("==").Lit(0)).Block(x.fail(Id("m").Dot("errPositive").Call(Id("op"), Lit(k.text))))
	case predWithin:
		r, _ := ck.expr(m, k.args[0])
		h, _ := ck.expr(m, k.args[1])
		b.If(Op("!").Add(r).Dot("Within").Call(Add(h).Dot("Size").Call())).Block(
			x.fail(Id("m").Dot("errWithin").Call(Id("op"), Lit(k.text), r, Add(h).Dot("ID").Call(), Add(h).Dot("Size").Call())),
		)
	case predAligned:
		r, _ := ck.expr(m, k.args[0])
		b.If(Op("!").Add(r).Dot("Aligned").Call(Id("m").Dot("info").Dot("Granularity"))).Block(
			x.fail(Id("m").Dot("errAligned").Call(Id("op"), Lit(k.text), r)),
		)
	case predFits:
		r, _ := ck.expr(m, k.args[0])
		h, _ := ck.expr(m, k.args[1])
		b.If(Add(r).Dot("Len").Op("!=").Add(h).Dot("Size").Call()).Block(
			x.fail(Id("m").Dot("errFits").Call(Id("op"), Lit(k.text), r, Add(h).Dot("ID").Call(), Add(h).Dot("Size").Call())),
		)
	}
}

// --- runnable examples -----------------------------------------------------

// emitExample writes example_test.go: Wrap and WithVerify over the generated
// fakes. The examples call methods by name, so they are written only while
// the spec has the shapes they use (an allocator with Allocate and Free, a
// VirtualBacking with Reserve and Commit); the fakes they use must be there
// (the fakes emitter's result says what the package declares).
func (ck *checkedGen) emitExample() error {
	s := ck.s
	fakes := resultOf[*fakesResult](ck.g, fakesEmitter)
	has := func(capName, method, effect string) bool {
		c := s.Capability(capName)
		if c == nil {
			return false
		}
		for _, m := range c.Methods {
			if m.Name == method && m.Accounting.Effect == effect {
				return true
			}
		}
		return false
	}
	if !has("DeviceAllocator", "Allocate", effectConsumes) || !has("DeviceAllocator", "Free", effectRefunds) ||
		!has("VirtualBacking", "Reserve", effectNone) || !has("VirtualBacking", "Commit", effectConsumes) {
		return nil
	}
	if missing := fakes.missing("NewMechanism", "Config", "Ledger", "NewGrant", "NewAccount", "Grant.Drawn", "Account.Refunded",
		fakeMechanism+"."+fakeCallCount("Free")); len(missing) > 0 {
		return fmt.Errorf("the checked wrapper's examples use %s, which the fakes (%s) do not declare", strings.Join(missing, ", "), fakes.dir)
	}
	dir := s.Packages.Checked
	f := NewFilePathName(ck.g.Import(dir)+"_test", path.Base(dir)+"_test")
	f.HeaderComment(ck.g.header(""))
	c := ck.g.C
	chk := func(n string) *Statement { return Qual(ck.g.Import(dir), n) }
	fk := func(n string) *Statement { return Qual(ck.g.Import(fakes.dir), n) }
	must := If(Err().Op("!=").Nil()).Block(Panic(Err()))

	comment(f, "Wrap a mechanism (here a fake) and every call draws from and refunds to the\nledger; a misuse is rejected before it reaches the mechanism.")
	f.Func().Id("ExampleWrap").Params().Block(
		Id("ctx").Op(":=").Qual("context", "Background").Call(),
		Id("mech").Op(":=").Add(fk("NewMechanism")).Call(fk("Config").Values(Dict{Id("Authority"): Lit("host")})),
		Id("m").Op(":=").Add(chk(checkedWrap)).Call(Id("mech"), fk("Ledger")),
		Id("grant").Op(":=").Add(fk("NewGrant")).Call(Lit("host"), Lit(1<<20)),
		Id("acct").Op(":=").Add(fk("NewAccount")).Call(Lit("host")),
		Line(),
		List(Id("a"), Err()).Op(":=").Id("m").Dot("Allocate").Call(Id("ctx"), c("AllocRequest").Values(Dict{Id("Size"): Lit(1000)}), Id("grant")),
		must,
		Qual("fmt", "Println").Call(Lit("allocated"), Id("a").Dot("Size").Call(), Lit("drew"), Id("grant").Dot("Drawn").Call()),
		Qual("fmt", "Println").Call(Lit("free:"), Id("m").Dot("Free").Call(Id("ctx"), Id("a"), Id("acct")), Lit("refunded"), Id("acct").Dot("Refunded").Call()),
		Line(),
		Err().Op("=").Id("m").Dot("Free").Call(Id("ctx"), Id("a"), Id("acct")),
		Qual("fmt", "Println").Call(Lit("second free:"), Qual("errors", "Is").Call(Err(), c("ErrReleased")), Lit("calls reaching the mechanism:"), Id("mech").Dot(fakeCallCount("Free")).Call()),
		Comment("Output:"),
		Comment("allocated 4096 drew 4096"),
		Comment("free: <nil> refunded 4096"),
		Comment("second free: true calls reaching the mechanism: 1"),
	)
	comment(f, "Verify mode catches a mechanism whose commit is a successful no-op (the\nfakes' LyingEager mode) and gives the grant back what was not installed.")
	f.Func().Id("ExampleWithVerify").Params().Block(
		Id("ctx").Op(":=").Qual("context", "Background").Call(),
		Id("mech").Op(":=").Add(fk("NewMechanism")).Call(fk("Config").Values(Dict{Id("Authority"): Lit("host"), Id("LyingEager"): True()})),
		Id("m").Op(":=").Add(chk(checkedWrap)).Call(Id("mech"), fk("Ledger"), chk(checkedWithVerify).Call()),
		List(Id("vb"), Err()).Op(":=").Add(c(requireFunc(s.Capability("VirtualBacking")))).Call(Id("m")),
		must,
		Id("grant").Op(":=").Add(fk("NewGrant")).Call(Lit("host"), Lit(1<<20)),
		Line(),
		List(Id("res"), Err()).Op(":=").Id("vb").Dot("Reserve").Call(Id("ctx"), c("ReserveRequest").Values(Dict{Id("Size"): Lit(1 << 20)})),
		Qual("fmt", "Println").Call(Lit("reserve took memory without a grant:"), Qual("errors", "Is").Call(Err(), c("ErrUntruthful"))),
		Line(),
		Err().Op("=").Id("vb").Dot("Commit").Call(Id("ctx"), Id("res"), c("Range").Values(Dict{Id("Len"): Lit(64 << 10)}), Id("grant")),
		Var().Id("e").Op("*").Add(c(contractError)),
		If(Qual("errors", "As").Call(Err(), Op("&").Id("e"))).Block(
			Qual("fmt", "Println").Call(Lit("commit:"), Qual("errors", "Is").Call(Id("e"), c("ErrUntruthful")), Lit("wanted"), Id("e").Dot("Wanted"), Lit("moved"), Id("e").Dot("Available")),
		),
		Qual("fmt", "Println").Call(Lit("still drawn:"), Id("grant").Dot("Drawn").Call()),
		Comment("Output:"),
		Comment("reserve took memory without a grant: true"),
		Comment("commit: true wanted 65536 moved 0"),
		Comment("still drawn: 0"),
	)
	var buf bytes.Buffer
	if err := f.Render(&buf); err != nil {
		return err
	}
	src, err := format.Source(buf.Bytes())
	if err != nil {
		return err
	}
	ck.g.Raw(dir+"/example_test.go", src)
	return nil
}
