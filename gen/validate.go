package gen

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// The generated code leans on these declarations by name: a spec without them
// cannot be generated, and says so at its top.
var (
	neededTypes = map[string][]string{
		"Bytes":         nil,
		"InstanceID":    nil,
		"HandleID":      nil,
		"AuthorityID":   nil,
		"Range":         {"Off", "Len"},
		"MechanismInfo": {"Instance", "Authority", "Mechanism", "Device", "AllocGranularity", "Granularity"},
	}
	// neededFields are the fields the templates and the conformance suite
	// use on a type the spec may leave out (with the capability using it):
	// when the type is declared, it must have them.
	neededFields = map[string][]string{
		"AllocRequest": {"Size", "Align"},
		"DeviceKey":    {"Kind"},
		"Allocation":   {"Addr"},
		"Reservation":  {"Addr"},
		"View":         {"Reservation", "Backing", "Access"},
	}
	neededErrors = []string{
		"ErrUnsupported", "ErrInvalidSize", "ErrInvalidRange", "ErrUnaligned",
		"ErrNilHandle", "ErrForeignHandle", "ErrReleased", "ErrNoGrant",
		"ErrAuthorityMismatch", "ErrUntruthful", "ErrNoAccount", "ErrForeignGrant",
		"ErrGrantClosed", "ErrGrantExhausted", "ErrOutOfMemory", "ErrClosed",
	}
	granularities = []string{"configurable", "device", "page"}

	// reservedNames are the contract's own top-level identifiers; a spec
	// declaration with one of these names would not compile. A test keeps the
	// list in step with the contract emitter (TestReservedNamesComplete).
	reservedNames = []string{
		contractCapSet, "Capabilities", contractCapability, "CapabilityMeta", "ChargeBook", contractCheckHandle, "ClaimChargeBook",
		"Effect", effectConst(effectConsumes), effectConst(effectNone), effectConst(effectQuery), effectConst(effectRefunds),
		contractError, contractErrorf, contractHandle, "Invariant", "InvariantMeta", contractIssuer,
		contractMechanism, "MechanismMeta", "MechanismSpec", "Meta", "MethodMeta",
		contractNegotiate, contractNewIssuer, contractOf, "RoundUp", contractSpecDigest, "SpecMeta",
		"TestNegotiateReportsAbsence", "TestSpecDigest",
		// the fault injector (contracttmpl/inject.go) and its tests
		"And", "Any", "ErrInjected", "Fail", "Injected", "FaultSet", "Injector", "InjectorFunc", "Not", "Op", "Or",
		"Predicate", "Randomly", "Rule", "Trace",
		"ExampleFail", "ExampleTrace", "TestInjectorAny", "TestInjectorConcurrent", "TestInjectorFaultSet",
		"TestInjectorNth", "TestInjectorPanics", "TestInjectorPredicates", "TestInjectorRandomly",
		"TestInjectorRule", "TestInjectorString", "TestInjectorTrace",
	}
	// handleMethods and rangeMethods are the methods the contract gives every
	// handle and Range; a field of the same name would not compile.
	handleMethods = []string{"Creator", "ID", "Live", "String"}
	// handleMembers are the identifiers the generated handle struct and its
	// Issuer.New<Handle> constructor use beside the fields, which are stored
	// under fieldName(field) and passed as parameters of that name.
	handleMembers = []string{"handleHeader", "hdr", "header", "i", "impl", "nextHandle", "nextInstance"}
	rangeMethods  = []string{"Aligned", "End", "Overlaps", "String", "Within"}

	// maxCapabilities is the width of the generated CapSet.
	maxCapabilities = 32
)

// validate checks the cross-references of a spec, however sound its
// structure: it is the second pass of one report (see Load).
func validate(s *Spec, e *errs) {
	s.types = map[string]*typeDecl{}
	s.ifcs = map[string]*interfaceDecl{}
	s.caps = map[string]*capability{}
	if s.loaded == nil {
		return // the document is not a mapping: nothing was declared
	}
	names, errNames := declareNames(s, e)
	validateNames(s, names, e)
	validatePackages(s, e)
	validateGeneratorNeeds(s, errNames, e)
	validateTemplateNeeds(s, e)
	for _, t := range s.Types {
		validateType(s, t, e)
	}
	roles := validateInterfaces(s, e)
	validateCycles(s, e)
	top := pos{s.File, 1, 1}
	for _, r := range []string{roleGrant, roleAccount} {
		if roles[r] == nil && s.sectionOK("interfaces") {
			e.add(top, "no interface has role %q, which consuming and refunding methods need", r)
		}
	}
	validateCapabilities(s, e)
	validateMechanisms(s, e)
	validateInvariantRefs(s, e)
}

// declareNames indexes the spec's types, interfaces and capabilities by
// name and returns every declared name with its position, and the error
// names. A name declared twice is reported once, and every later reference
// resolves to its first declaration of that kind, so the duplicate does not
// also turn into "unknown" errors wherever the name is used.
func declareNames(s *Spec, e *errs) (names map[string]pos, errNames map[string]bool) {
	names = map[string]pos{}
	declare := func(n string, p pos) {
		if prev, ok := names[n]; ok {
			e.add(p, "duplicate name %q (already declared at %d:%d)", n, prev.Line, prev.Col)
			return
		}
		names[n] = p
	}
	for _, t := range s.Types {
		declare(t.Name, t.Pos)
		if s.types[t.Name] == nil {
			s.types[t.Name] = t
		}
	}
	for _, i := range s.Interfaces {
		declare(i.Name, i.Pos)
		if s.ifcs[i.Name] == nil {
			s.ifcs[i.Name] = i
		}
	}
	for _, c := range s.Capabilities {
		declare(c.Name, c.Pos)
		if s.caps[c.Name] == nil {
			s.caps[c.Name] = c
		}
	}
	errNames = map[string]bool{}
	for _, d := range s.Errors {
		declare(d.Name, d.Pos)
		errNames[d.Name] = true
	}
	return names, errNames
}

// validateGeneratorNeeds reports the types, fields and errors the generator
// uses that the spec does not declare.
func validateGeneratorNeeds(s *Spec, errNames map[string]bool, e *errs) {
	top := pos{s.File, 1, 1}
	if s.sectionOK("types") {
		var missing []string
		for _, n := range sortedNames(neededTypes) {
			t := s.types[n]
			if t == nil {
				missing = append(missing, strconv.Quote(n))
				continue
			}
			for _, f := range neededTypes[n] {
				if !t.hasField(f) {
					e.add(t.Pos, "type %s: the generator needs field %q", n, f)
				}
			}
		}
		for _, n := range sortedNames(neededFields) {
			t := s.types[n]
			if t == nil {
				continue
			}
			for _, f := range neededFields[n] {
				if !t.hasField(f) {
					e.add(t.Pos, "type %s: the generator needs field %q", n, f)
				}
			}
		}
		if len(missing) > 0 {
			e.add(top, "the generator needs %s %s, which the spec does not declare", plural(len(missing), "type", "types"), strings.Join(missing, ", "))
		}
	}
	if s.sectionOK("errors") {
		var missing []string
		for _, n := range neededErrors {
			if !errNames[n] {
				missing = append(missing, strconv.Quote(n))
			}
		}
		if len(missing) > 0 {
			e.add(top, "the generator needs %s %s, which the spec does not declare", plural(len(missing), "error", "errors"), strings.Join(missing, ", "))
		}
	}
}

// validateInterfaces checks each interface's methods and that no two
// interfaces take the same role, and returns the interfaces by role.
func validateInterfaces(s *Spec, e *errs) map[string]*interfaceDecl {
	roles := map[string]*interfaceDecl{}
	for _, i := range s.Interfaces {
		if i.Role != "" {
			if prev := roles[i.Role]; prev != nil {
				e.add(i.Pos, "interface %s: role %q already taken by %s", i.Name, i.Role, prev.Name)
			}
			roles[i.Role] = i
		}
		for _, m := range i.Methods {
			validateSignature(s, m, e)
		}
	}
	return roles
}

// validateCapabilities checks each capability's methods (names unique
// across capabilities, signatures, effects) and that one is required.
func validateCapabilities(s *Spec, e *errs) {
	methods := map[string]pos{}
	required := 0
	for _, c := range s.Capabilities {
		if c.Required {
			required++
		}
		if len(c.Methods) == 0 {
			e.add(c.Pos, "capability %s: declares no methods", c.Name)
		}
		for _, m := range c.Methods {
			if prev, ok := methods[m.Name]; ok {
				e.add(m.Pos, "%s.%s: duplicate method name %q (already declared at %d:%d; one mechanism type implements every capability)", c.Name, m.Name, m.Name, prev.Line, prev.Col)
			}
			methods[m.Name] = m.Pos
			validateSignature(s, m, e)
			validateEffects(s, m, e)
		}
	}
	if required == 0 && len(s.Capabilities) > 0 && s.sectionOK("capabilities") {
		e.add(s.Capabilities[0].Pos, "no capability is required: mark the one every mechanism offers with required: true")
	}
}

// validateInvariantRefs reports the capabilities and interfaces an
// invariant applies to that the spec does not declare.
func validateInvariantRefs(s *Spec, e *errs) {
	for _, iv := range s.Invariants {
		a := iv.Applies
		for i, c := range a.Capabilities {
			if s.caps[c] == nil && s.sectionOK("capabilities") {
				e.add(a.CapPos[i], "invariant %s: unknown capability %q", iv.ID, c)
			}
		}
		for i, n := range a.Interfaces {
			if s.ifcs[n] == nil && s.sectionOK("interfaces") {
				e.add(a.IfcPos[i], "invariant %s: unknown interface %q", iv.ID, n)
			}
		}
	}
}

// validateNames reports declarations that would clash in the generated
// contract: reserved identifiers, and the names the generator derives (enum
// constants, capability constants, Require helpers, accessors, handle and
// Range methods).
func validateNames(s *Spec, declared map[string]pos, e *errs) {
	reserved := map[string]bool{}
	for _, n := range reservedNames {
		reserved[n] = true
	}
	check := func(n string, p pos) {
		if reserved[n] {
			e.add(p, "%q is reserved: the generated contract declares it", n)
		}
	}
	for _, t := range s.Types {
		check(t.Name, t.Pos)
	}
	for _, i := range s.Interfaces {
		check(i.Name, i.Pos)
	}
	for _, c := range s.Capabilities {
		check(c.Name, c.Pos)
	}
	for _, d := range s.Errors {
		check(d.Name, d.Pos)
	}
	derived := map[string]string{}
	derive := func(n string, p pos, from string) {
		if prev, ok := declared[n]; ok {
			e.add(p, "%s generates %q, which clashes with the declaration at %d:%d", from, n, prev.Line, prev.Col)
			return
		}
		if reserved[n] {
			e.add(p, "%s generates %q, which is reserved: the generated contract declares it", from, n)
			return
		}
		if other, ok := derived[n]; ok {
			e.add(p, "%s generates %q, which %s also generates", from, n, other)
			return
		}
		derived[n] = from
	}
	for _, t := range s.Types {
		if t.Kind == kindEnum {
			for _, v := range t.Values {
				derive(t.Name+v.Name, v.Pos, "enum value "+t.Name+"."+v.Name)
			}
		}
		var methods []string
		switch {
		case t.Kind == KindHandle:
			methods = handleMethods
		case t.Name == "Range":
			methods = rangeMethods
		}
		for _, f := range t.Fields {
			switch {
			case contains(methods, f.Name):
				e.add(f.Pos, "type %s: field %s clashes with the generated method %s.%s", t.Name, f.Name, t.Name, f.Name)
			case t.Kind == KindHandle && contains(handleMembers, fieldName(f.Name)):
				e.add(f.Pos, "type %s: field %s would be stored as %s, which the generated handle code already uses (its header, Issuer.New%s's receiver and impl, or a package-level name)", t.Name, f.Name, fieldName(f.Name), t.Name)
			}
		}
	}
	accessors := map[string]bool{}
	for i, c := range s.Capabilities {
		if i == maxCapabilities {
			e.add(c.Pos, "capability %s: at most %d capabilities fit a CapSet", c.Name, maxCapabilities)
		}
		derive(capConst(c), c.Pos, "capability "+c.Name)
		if !c.Required {
			derive(requireFunc(c), c.Pos, "capability "+c.Name)
			accessors[accessor(c)] = true
		}
	}
	for _, c := range s.Capabilities {
		for _, m := range c.Methods {
			if accessors[m.Name] {
				e.add(m.Pos, "%s.%s: clashes with the Mechanism accessor %s", c.Name, m.Name, m.Name)
			}
		}
	}
}

func (t *typeDecl) hasField(n string) bool { return t.Field(n) != nil }

// field returns the field named n, or nil.
func (t *typeDecl) Field(n string) *field {
	for _, f := range t.Fields {
		if f.Name == n {
			return f
		}
	}
	return nil
}

func (t *typeDecl) hasValue(n string) bool {
	for _, v := range t.Values {
		if v.Name == n {
			return true
		}
	}
	return false
}

func validateType(s *Spec, t *typeDecl, e *errs) {
	switch t.Kind {
	case kindScalar:
		if !contains([]string{"uint64", "string", "int"}, t.Go) {
			e.add(t.Pos, "type %s: scalar needs go: uint64, int or string, got %q", t.Name, t.Go)
		}
	case kindEnum:
		if len(t.Values) == 0 {
			e.add(t.Pos, "type %s: enum declares no values", t.Name)
		}
	case kindStruct, KindHandle:
		if len(t.Fields) == 0 && t.Kind == kindStruct {
			e.add(t.Pos, "type %s: struct declares no fields", t.Name)
		}
		for _, f := range t.Fields {
			if !s.knownValueType(f.Type) && s.refsChecked() {
				e.add(f.Pos, "type %s: field %s has undeclared type %q", t.Name, f.Name, f.Type)
			} else if f.Type == t.Name {
				e.add(f.Pos, "type %s: field %s refers to its own type", t.Name, f.Name)
			}
		}
	}
	if t.Kind != kindScalar && t.Kind != "" && t.Go != "" {
		e.add(t.Pos, "type %s: only scalars take \"go\"", t.Name)
	}
	if t.Kind != kindEnum && t.Kind != "" && len(t.Values) > 0 {
		e.add(t.Pos, "type %s: only enums take \"values\"", t.Name)
	}
}

// knownValueType reports whether n names a builtin or a declared type.
func (s *Spec) knownValueType(n string) bool { return builtins[n] || s.types[n] != nil }

func (s *Spec) knownType(n string) bool { return s.knownValueType(n) || s.ifcs[n] != nil }

func validateSignature(s *Spec, m *method, e *errs) {
	what := m.Owner + "." + m.Name
	seen := map[string]bool{}
	for _, p := range m.Params {
		if seen[p.Name] {
			e.add(p.Pos, "%s: duplicate parameter %q", what, p.Name)
		}
		if why := badParamName(p.Name, s.caps[m.Owner] != nil); why != "" {
			e.add(p.NamePos, "%s: parameter %q %s; rename it", what, p.Name, why)
		}
		seen[p.Name] = true
		if p.Type != "" && !s.knownType(p.Type) && s.refsChecked() {
			e.add(p.Pos, "%s: parameter %s has undeclared type %q", what, p.Name, p.Type)
		}
	}
	for i, r := range m.Returns {
		if !s.knownType(r.Type) && s.refsChecked() {
			e.add(r.Pos, "%s: result has undeclared type %q", what, r.Type)
		}
		if r.Type == "error" && i != len(m.Returns)-1 {
			e.add(r.Pos, "%s: error must be the last result", what)
		}
	}
}

// exprType resolves an expression against a method's parameters and returns
// the name of its type, or "" after reporting why it does not resolve.
func exprType(s *Spec, m *method, x *expr, e *errs) string {
	what := m.Owner + "." + m.Name
	p := m.Param(x.Param)
	if p == nil && m.badParams {
		return ""
	}
	if p == nil {
		e.add(x.Pos, "%s: %q names no parameter", what, x.Text)
		return ""
	}
	if !s.knownType(p.Type) {
		return "" // reported with the parameter
	}
	if x.Func == "committed" {
		t := s.types[p.Type]
		if t == nil || t.Kind != KindHandle {
			e.add(x.Pos, "%s: committed(%s) needs a handle parameter", what, x.Param)
			return ""
		}
		if committedQuery(s, p.Type) == nil {
			e.add(x.Pos, "%s: committed(%s) needs a query method taking only a %s and returning [Bytes, error]", what, x.Param, p.Type)
			return ""
		}
		return "Bytes"
	}
	cur := p.Type
	for _, f := range x.Path {
		t := s.types[cur]
		if t == nil || (t.Kind != kindStruct && t.Kind != KindHandle) {
			e.add(x.Pos, "%s: %q: %s has no fields", what, x.Text, cur)
			return ""
		}
		fd := t.Field(f)
		if fd == nil {
			e.add(x.Pos, "%s: %q: %s has no field %s", what, x.Text, cur, f)
			return ""
		}
		cur = fd.Type
	}
	return cur
}

// committedQuery finds the query method that reports the committed bytes of a
// handle type: the checked wrapper calls it to verify and to refund releases.
func committedQuery(s *Spec, handle string) *method {
	for _, c := range s.Capabilities {
		for _, m := range c.Methods {
			if m.Accounting.Effect == effectQuery && len(m.Params) == 1 && m.Params[0].Type == handle &&
				len(m.Returns) == 2 && m.Returns[0].Type == "Bytes" && m.Returns[1].Type == "error" {
				return m
			}
		}
	}
	return nil
}

func validateEffects(s *Spec, m *method, e *errs) {
	what := m.Owner + "." + m.Name
	a := m.Accounting
	grant, account := s.roleInterface(roleGrant), s.roleInterface(roleAccount)
	switch a.Effect {
	case effectConsumes, effectRefunds:
		if a.Amount != nil {
			if t := exprType(s, m, a.Amount, e); t != "" && t != "Bytes" {
				e.add(a.Amount.Pos, "%s: %s amount %q is %s %s, not Bytes", what, a.Effect, a.Amount.Text, article(t), t)
			}
		}
		if a.Account == "" {
			break
		}
		p := m.Param(a.Account)
		want, role := account, "account"
		if a.Effect == effectConsumes {
			want, role = grant, "grant"
		}
		switch {
		case p == nil && m.badParams:
		case p == nil && a.Effect == effectConsumes:
			e.add(a.Pos, "%s: consuming method without a grant parameter (from: %q names no parameter)", what, a.Account)
		case p == nil:
			e.add(a.Pos, "%s: refunding method without an account parameter (to: %q names no parameter)", what, a.Account)
		case want != nil && p.Type != want.Name && s.knownType(p.Type):
			e.add(p.Pos, "%s: parameter %s must be the %s interface %s, not %s", what, p.Name, role, want.Name, p.Type)
		}
	}
	if a.Effect == effectConsumes && !m.ReturnsError() {
		e.add(m.Pos, "%s: a consuming method must return an error", what)
	}
	if a.Effect == effectQuery && (m.Creates != "" || m.Releases != "") {
		e.add(m.Pos, "%s: a query neither creates nor releases", what)
	}
	if m.Releases != "" {
		p := m.Param(m.Releases)
		switch {
		case p == nil && !m.badParams:
			e.add(m.Pos, "%s: release method without the handle it releases (releases: %q names no parameter)", what, m.Releases)
		case p != nil:
			if t := s.types[p.Type]; t == nil && s.refsChecked() || t != nil && t.Kind != KindHandle && t.Kind != "" {
				e.add(p.Pos, "%s: releases %s, which is not a handle", what, p.Name)
			}
		}
		if !m.ReturnsError() {
			e.add(m.Pos, "%s: a release method must return an error", what)
		}
	}
	if m.Creates != "" {
		t := s.types[m.Creates]
		if t == nil || t.Kind != KindHandle {
			e.add(m.Pos, "%s: creates %q, which is not a declared handle", what, m.Creates)
		} else if len(m.Returns) == 0 || m.Returns[0].Type != m.Creates {
			e.add(m.Pos, "%s: creates %s but does not return it first", what, m.Creates)
		}
	}
	for _, r := range m.Requires {
		types := make([]string, len(r.Args))
		for i, x := range r.Args {
			types[i] = exprType(s, m, x, e)
		}
		bad := func(i int, want string) {
			if types[i] != "" {
				e.add(r.Pos, "%s.requires: %s: argument %q is %s %s, want %s", what, r.Text, r.Args[i].Text, article(types[i]), types[i], want)
			}
		}
		isHandle := func(i int) bool { t := s.types[types[i]]; return t != nil && t.Kind == KindHandle }
		switch r.Pred {
		case predLive:
			if !isHandle(0) {
				bad(0, "a handle")
			}
		case predPositive:
			if types[0] != "Bytes" {
				bad(0, "Bytes")
			}
		case predAligned:
			if types[0] != "Range" {
				bad(0, "a Range")
			}
		case predWithin, predFits:
			if types[0] != "Range" {
				bad(0, "a Range")
			}
			if !isHandle(1) {
				bad(1, "a handle")
			} else if t := s.types[types[1]]; !t.hasField("Size") {
				e.add(r.Pos, "%s.requires: %s: %s has no Size field", what, r.Text, t.Name)
			}
		}
	}
}

// Describe renders an accounting effect as a clause for docs and metadata:
// "consumes req.Size, rounded up to the allocation granularity, drawn from
// grant", "refunds a.Size to the account to".
func (a accounting) Describe() string {
	round := map[string]string{roundAlloc: ", rounded up to the allocation granularity,", roundGranularity: ", rounded up to the granularity,"}[a.Round]
	if round == "" && a.Effect == effectConsumes {
		round = ","
	}
	switch a.Effect {
	case effectConsumes:
		return fmt.Sprintf("consumes %s%s drawn from %s", a.Amount.Text, round, a.Account)
	case effectRefunds:
		return fmt.Sprintf("refunds %s%s to the account %s", a.Amount.Text, round, a.Account)
	case effectQuery:
		return "only queries"
	}
	return "moves no bytes"
}

// sectionOK reports whether references into top-level section k can be
// checked: it loaded as a mapping, or it is optional and absent (then it
// really declares nothing). A required section that is missing, or any
// section that is not a mapping, was reported already; references into it
// are not reported again.
func (s *Spec) sectionOK(k string) bool {
	if ok, present := s.loaded[k]; present {
		return ok
	}
	return !contains(specRequired["spec"], k)
}

// refsChecked reports whether type references can be checked: both sections
// that declare types loaded.
func (s *Spec) refsChecked() bool { return s.sectionOK("types") && s.sectionOK("interfaces") }

func sortedNames[V any](m map[string]V) []string {
	ns := make([]string, 0, len(m))
	for n := range m {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
