package gen

import (
	"fmt"
	"strings"

	. "github.com/dave/jennifer/jen"
)

// contractEmitter writes the contract package: the spec's types, errors,
// interfaces and capabilities, negotiation, handles and Meta. Every other Go
// emitter's output refers to it.
var contractEmitter = &emitter{Name: "contract", Emit: noResult(emitContract)}

func init() { register(contractEmitter) }

// The contract's own declarations that other emitters' output names (the
// spec's declarations keep their spec names). The contract emitter declares
// them under these names, the emitters that require it refer to them by
// these names and the validator reserves them (reservedNames), so renaming
// one here renames it everywhere.
const (
	contractMechanism   = "Mechanism"   // the interface a mechanism implements
	contractCapability  = "Capability"  // one capability of the spec
	contractCapSet      = "CapSet"      // a set of them
	contractOf          = "Of"          // the CapSet of its arguments
	contractNegotiate   = "Negotiate"   // the capabilities a Mechanism offers now
	contractHandle      = "Handle"      // what every handle type has in common
	contractCheckHandle = "CheckHandle" // a handle's nil, creator and liveness check
	contractError       = "Error"       // the typed error
	contractErrorf      = "Errorf"      // an *Error with a formatted detail
	contractIssuer      = "Issuer"      // creates and retires one instance's handles
	contractNewIssuer   = "NewIssuer"   // an Issuer with a fresh instance id
	contractSpecDigest  = "SpecDigest"  // the sha256 of the spec
)

func (g *generator) contractFile(name string) *File {
	return g.File(g.Spec.Packages.Contract+"/"+name, "memapi")
}

func emitContract(g *generator) error {
	emitContractDoc(g)
	emitTypes(g)
	emitErrors(g)
	emitInterfaces(g)
	emitCapabilities(g)
	emitHandles(g)
	if err := emitRanges(g); err != nil {
		return err
	}
	if err := emitInjector(g); err != nil {
		return err
	}
	emitMeta(g)
	emitTripwire(g)
	return nil
}

func emitContractDoc(g *generator) {
	f := g.contractFile("doc.go")
	f.PackageComment(strings.TrimSpace(`
Package memapi is the contract of memgen, generated from spec/capabilities.yaml.

It holds the value types, the sentinel errors and the typed Error, the
capability interfaces a mechanism implements (DeviceAllocator always;
VirtualBacking and SharedMapping only when the mechanism really offers them),
the Mechanism interface whose optional capabilities are explicit accessors,
capability negotiation (Negotiate, Require...), the handle types and their
Issuer, the ledger interfaces consuming calls draw from (Grant) and refunds go
to (Account), the device-context contract (DeviceContext, Stream, Fence), and
the spec itself as data (Meta).

Mechanisms never draw from grants or refund to accounts: the checked wrapper
(package checked) does, driven by each method's accounting effect. There are
no default methods anywhere: an unsupported capability is absent, and Require
helpers return an error that matches errors.ErrUnsupported.

Fault injection is one Injector that every layer consults before an operation
that can fail changes anything (the fakes, the mechanisms' system and driver
calls, a plugin's slots, the ledger): rules (Fail) say which operations fail,
and compose with Any, predicates and Nth.`))
	comment(f, "SpecDigest is the sha256 of the spec these files were generated from.")
	comment(f, "A test beside it fails when the spec has changed since.")
	f.Const().Id(contractSpecDigest).Op("=").Lit(g.Spec.Digest)
}

func emitTypes(g *generator) {
	f := g.contractFile("types.go")
	for _, t := range g.Spec.Types {
		switch t.Kind {
		case kindScalar:
			comment(f, docComment(t.Name, t.Doc))
			f.Type().Id(t.Name).Id(t.Go)
		case kindEnum:
			emitEnum(f, t)
		case kindStruct:
			comment(f, docComment(t.Name, t.Doc))
			var fields []Code
			for _, fd := range t.Fields {
				fields = append(fields, Id(fd.Name).Add(g.Type(fd.Type)))
			}
			f.Type().Id(t.Name).Struct(fields...)
		}
		f.Line()
	}
}

func emitEnum(f *File, t *typeDecl) {
	comment(f, docComment(t.Name, t.Doc)+" The zero value is invalid.")
	f.Type().Id(t.Name).Uint8()
	f.Const().DefsFunc(func(d *Group) {
		for i, v := range t.Values {
			comment(d, valueDoc(t.Name+v.Name, v.Doc))
			if i == 0 {
				d.Id(t.Name + v.Name).Id(t.Name).Op("=").Iota().Op("+").Lit(1)
			} else {
				d.Id(t.Name + v.Name)
			}
		}
	})
	f.Func().Params(Id("v").Id(t.Name)).Id("String").Params().String().BlockFunc(func(b *Group) {
		b.Switch(Id("v")).BlockFunc(func(s *Group) {
			for _, v := range t.Values {
				s.Case(Id(t.Name + v.Name)).Return(Lit(v.Name))
			}
		})
		b.Return(Qual("fmt", "Sprintf").Call(Lit(t.Name+"(%d)"), Uint8().Call(Id("v"))))
	})
	comment(f, "Valid reports whether v is one of the declared values.")
	f.Func().Params(Id("v").Id(t.Name)).Id("Valid").Params().Bool().Block(
		Return(Id("v").Op(">=").Id(t.Name + t.Values[0].Name).Op("&&").Id("v").Op("<=").Id(t.Name + t.Values[len(t.Values)-1].Name)),
	)
}

func emitErrors(g *generator) {
	f := g.contractFile("errors.go")
	comment(f, "Sentinel errors. Compare with errors.Is: every error the contract returns")
	comment(f, "wraps exactly one of them, usually inside an *Error carrying the figures.")
	f.Var().DefsFunc(func(d *Group) {
		for _, e := range g.Spec.Errors {
			comment(d, errorDoc(e.Name, e.Doc))
			msg := "memapi: " + words(strings.TrimPrefix(e.Name, "Err"))
			if e.Unsupported {
				d.Id(e.Name).Op("=").Qual("fmt", "Errorf").Call(Lit(msg+": %w"), Qual("errors", "ErrUnsupported"))
			} else {
				d.Id(e.Name).Op("=").Qual("errors", "New").Call(Lit(msg))
			}
		}
	})
	f.Line()
	comment(f, `Error is the typed error of the contract: the operation, the kind (one of
the sentinels), the figures involved, and the underlying cause (an errno, a
CUresult). errors.Is matches both the kind and the cause.`)
	f.Type().Id(contractError).Struct(
		Id("Op").String().Comment("Capability.Method or a layer's operation"),
		Id("Kind").Error().Comment("one of the sentinel errors"),
		Id("Mechanism").Id("MechanismID"),
		Id("Authority").Id("AuthorityID"),
		Id("Handle").Id("HandleID").Comment("the handle involved, when there is one"),
		Id("Wanted").Id("Bytes").Comment("bytes asked for"),
		Id("Available").Id("Bytes").Comment("bytes that were available"),
		Id("Detail").String().Comment("a short explanation"),
		Id("Err").Error().Comment("the underlying cause, or nil"),
	)
	f.Func().Params(Id("e").Op("*").Id(contractError)).Id("Error").Params().String().Block(
		Var().Id("b").Qual("strings", "Builder"),
		If(Id("e").Dot("Op").Op("!=").Lit("")).Block(
			Id("b").Dot("WriteString").Call(Id("e").Dot("Op")),
			Id("b").Dot("WriteString").Call(Lit(": ")),
		),
		If(Id("e").Dot("Kind").Op("!=").Nil()).Block(
			Id("b").Dot("WriteString").Call(Qual("strings", "TrimPrefix").Call(Id("e").Dot("Kind").Dot("Error").Call(), Lit("memapi: "))),
		).Else().Block(Id("b").Dot("WriteString").Call(Lit("error"))),
		If(Id("e").Dot("Detail").Op("!=").Lit("")).Block(
			Id("b").Dot("WriteString").Call(Lit(": ")),
			Id("b").Dot("WriteString").Call(Id("e").Dot("Detail")),
		),
		If(Id("e").Dot("Wanted").Op("!=").Lit(0).Op("||").Id("e").Dot("Available").Op("!=").Lit(0)).Block(
			Qual("fmt", "Fprintf").Call(Op("&").Id("b"), Lit(" (wanted %d, available %d)"), Id("e").Dot("Wanted"), Id("e").Dot("Available")),
		),
		If(Id("e").Dot("Mechanism").Op("!=").Lit("")).Block(
			Qual("fmt", "Fprintf").Call(Op("&").Id("b"), Lit(" [mechanism %s]"), Id("e").Dot("Mechanism")),
		),
		If(Id("e").Dot("Authority").Op("!=").Lit("")).Block(
			Qual("fmt", "Fprintf").Call(Op("&").Id("b"), Lit(" [authority %s]"), Id("e").Dot("Authority")),
		),
		If(Id("e").Dot("Handle").Op("!=").Lit(0)).Block(
			Qual("fmt", "Fprintf").Call(Op("&").Id("b"), Lit(" [handle #%d]"), Id("e").Dot("Handle")),
		),
		If(Id("e").Dot("Err").Op("!=").Nil()).Block(
			Id("b").Dot("WriteString").Call(Lit(": ")),
			Id("b").Dot("WriteString").Call(Id("e").Dot("Err").Dot("Error").Call()),
		),
		Return(Id("b").Dot("String").Call()),
	)
	comment(f, "Unwrap returns the kind and the cause (those that are set), so errors.Is and\nerrors.As see both.")
	f.Func().Params(Id("e").Op("*").Id(contractError)).Id("Unwrap").Params().Index().Error().Block(
		Id("errs").Op(":=").Make(Index().Error(), Lit(0), Lit(2)),
		For(List(Id("_"), Id("x")).Op(":=").Range().Index().Error().Values(Id("e").Dot("Kind"), Id("e").Dot("Err"))).Block(
			If(Id("x").Op("!=").Nil()).Block(Id("errs").Op("=").Append(Id("errs"), Id("x"))),
		),
		Return(Id("errs")),
	)
	comment(f, "Errorf returns an *Error of the given kind with a formatted detail.")
	f.Func().Id(contractErrorf).Params(Id("op").String(), Id("kind").Error(), Id("format").String(), Id("args").Op("...").Any()).Op("*").Id(contractError).Block(
		Return(Op("&").Id(contractError).Values(Dict{
			Id("Op"):     Id("op"),
			Id("Kind"):   Id("kind"),
			Id("Detail"): Qual("fmt", "Sprintf").Call(Id("format"), Id("args").Op("...")),
		})),
	)
}

func emitInterfaces(g *generator) {
	f := g.contractFile("interfaces.go")
	for _, i := range g.Spec.Interfaces {
		comment(f, docComment(i.Name, i.Doc))
		f.Type().Id(i.Name).InterfaceFunc(func(b *Group) {
			for _, m := range i.Methods {
				p, r := g.Signature(m)
				comment(b, docComment(m.Name, m.Doc))
				b.Id(m.Name).Params(p...).Params(r...)
			}
		})
		f.Line()
	}
}

// accessor returns the name of the Mechanism accessor of an optional capability.
func accessor(c *capability) string { return "As" + c.Name }

// capConst returns the name of a capability's constant.
func capConst(c *capability) string { return "Cap" + c.Name }

// requireFunc returns the name of the Require helper of an optional
// capability.
func requireFunc(c *capability) string { return "Require" + c.Name }

// effectConst returns the name of the Effect constant of an accounting
// effect (none, query, consumes, refunds).
func effectConst(effect string) string { return "Effect" + strings.ToUpper(effect[:1]) + effect[1:] }

func methodDoc(m *method) string {
	d := docComment(m.Name, m.Doc)
	var notes []string
	switch m.Accounting.Effect {
	case effectConsumes, effectRefunds:
		notes = append(notes, "It "+m.Accounting.Describe()+" (the checked wrapper moves the bytes; the mechanism never does).")
	case effectQuery:
		notes = append(notes, "It only queries.")
	case effectNone:
		notes = append(notes, "It moves no bytes.")
	}
	if m.Creates != "" {
		notes = append(notes, "It creates "+article(m.Creates)+" "+m.Creates+" that records this instance as its creator.")
	}
	if m.Releases != "" {
		notes = append(notes, "It releases "+m.Releases+"; only its creator may, and only once.")
	}
	if len(m.Requires) > 0 {
		var rs []string
		for _, r := range m.Requires {
			rs = append(rs, r.Text)
		}
		notes = append(notes, "The checked wrapper requires "+strings.Join(rs, ", ")+".")
	}
	return d + "\n\n" + strings.Join(notes, " ")
}

// emitCapabilities writes capabilities.go: an interface per capability, the
// Mechanism interface, the Capability enum and CapSet, Negotiate, and a
// Require helper per optional capability.
func emitCapabilities(g *generator) {
	f := g.contractFile("capabilities.go")
	s := g.Spec
	emitCapabilityInterfaces(g, f)
	emitMechanismInterface(f, s)
	emitCapabilityEnum(f, s)
	emitCapSet(f)
	emitNegotiate(f, s)
	emitRequireHelpers(f, s)
}

// emitCapabilityInterfaces writes the interface of each capability, its
// methods documented with their accounting.
func emitCapabilityInterfaces(g *generator, f *File) {
	s := g.Spec
	for _, c := range s.Capabilities {
		doc := docComment(c.Name, c.Doc)
		if c.Required {
			doc += "\n\nEvery mechanism offers " + c.Name + "."
		} else {
			doc += "\n\nIt is optional: reach it through Mechanism." + accessor(c) + " or " + requireFunc(c) + "; never assume it."
		}
		comment(f, doc)
		f.Type().Id(c.Name).InterfaceFunc(func(b *Group) {
			for i, m := range c.Methods {
				if i > 0 {
					b.Line()
				}
				p, r := g.Signature(m)
				comment(b, methodDoc(m))
				b.Id(m.Name).Params(p...).Params(r...)
			}
		})
		f.Line()
	}
}

// emitMechanismInterface writes Mechanism: the required capabilities and an
// accessor per optional one.
func emitMechanismInterface(f *File, s *Spec) {
	comment(f, `Mechanism is a memory mechanism: the required capabilities, plus one
accessor per optional capability that reports whether this instance really
offers it now. An accessor that returns false means absent: there is no
default implementation to fall back on.`)
	f.Type().Id(contractMechanism).InterfaceFunc(func(b *Group) {
		for _, c := range s.Capabilities {
			if c.Required {
				b.Id(c.Name)
			}
		}
		for _, c := range s.Capabilities {
			if !c.Required {
				comment(b, accessor(c)+" returns the "+c.Name+" capability and true when the instance offers it, or nil and false.")
				b.Id(accessor(c)).Params().Params(Id(c.Name), Bool())
			}
		}
	})
	f.Line()
}

// emitCapabilityEnum writes Capability, its constants (Cap<Name>) and the
// list of them all.
func emitCapabilityEnum(f *File, s *Spec) {
	comment(f, "Capability names one capability of the spec.")
	f.Type().Id(contractCapability).Uint8()
	f.Const().DefsFunc(func(d *Group) {
		for i, c := range s.Capabilities {
			if i == 0 {
				d.Id(capConst(c)).Id(contractCapability).Op("=").Iota()
			} else {
				d.Id(capConst(c))
			}
		}
	})
	f.Func().Params(Id("c").Id(contractCapability)).Id("String").Params().String().BlockFunc(func(b *Group) {
		b.Switch(Id("c")).BlockFunc(func(sw *Group) {
			for _, c := range s.Capabilities {
				sw.Case(Id(capConst(c))).Return(Lit(c.Name))
			}
		})
		b.Return(Qual("fmt", "Sprintf").Call(Lit("Capability(%d)"), Uint8().Call(Id("c"))))
	})
	comment(f, "Capabilities lists every capability in spec order.")
	f.Var().Id("Capabilities").Op("=").Index().Id(contractCapability).ValuesFunc(func(v *Group) {
		for _, c := range s.Capabilities {
			v.Id(capConst(c))
		}
	})
}

// emitCapSet writes CapSet with Of, Has and String.
func emitCapSet(f *File) {
	comment(f, "CapSet is a set of capabilities.")
	f.Type().Id(contractCapSet).Uint32()
	comment(f, "Of returns the set holding cs.")
	f.Func().Id(contractOf).Params(Id("cs").Op("...").Id(contractCapability)).Id(contractCapSet).Block(
		Var().Id("s").Id(contractCapSet),
		For(List(Id("_"), Id("c")).Op(":=").Range().Id("cs")).Block(Id("s").Op("|=").Lit(1).Op("<<").Id("c")),
		Return(Id("s")),
	)
	comment(f, "Has reports whether c is in the set.")
	f.Func().Params(Id("s").Id(contractCapSet)).Id("Has").Params(Id("c").Id(contractCapability)).Bool().Block(
		Return(Id("s").Op("&").Parens(Lit(1).Op("<<").Id("c")).Op("!=").Lit(0)),
	)
	f.Func().Params(Id("s").Id(contractCapSet)).Id("String").Params().String().Block(
		Var().Id("names").Index().String(),
		For(List(Id("_"), Id("c")).Op(":=").Range().Id("Capabilities")).Block(
			If(Id("s").Dot("Has").Call(Id("c"))).Block(Id("names").Op("=").Append(Id("names"), Id("c").Dot("String").Call())),
		),
		Return(Lit("{").Op("+").Qual("strings", "Join").Call(Id("names"), Lit(", ")).Op("+").Lit("}")),
	)
}

// emitNegotiate writes Negotiate, which asks a mechanism's accessors.
func emitNegotiate(f *File, s *Spec) {
	comment(f, "Negotiate returns the capabilities m offers now. It asks the accessors;")
	comment(f, "it never assumes.")
	f.Func().Id(contractNegotiate).Params(Id("m").Id(contractMechanism)).Id(contractCapSet).BlockFunc(func(b *Group) {
		var req []Code
		for _, c := range s.Capabilities {
			if c.Required {
				req = append(req, Id(capConst(c)))
			}
		}
		b.Id("s").Op(":=").Id(contractOf).Call(req...)
		for _, c := range s.Capabilities {
			if !c.Required {
				b.If(List(Id("_"), Id("ok")).Op(":=").Id("m").Dot(accessor(c)).Call(), Id("ok")).Block(
					Id("s").Op("|=").Id(contractOf).Call(Id(capConst(c))),
				)
			}
		}
		b.Return(Id("s"))
	})
}

// emitRequireHelpers writes Require<Name> for each optional capability: the
// capability, or an *Error that matches errors.ErrUnsupported.
func emitRequireHelpers(f *File, s *Spec) {
	for _, c := range s.Capabilities {
		if c.Required {
			continue
		}
		name := requireFunc(c)
		comment(f, fmt.Sprintf("%s returns m's %s, or an *Error of kind ErrUnsupported\n(errors.Is(err, errors.ErrUnsupported) holds) when m does not offer it.", name, c.Name))
		f.Func().Id(name).Params(Id("m").Id(contractMechanism)).Params(Id(c.Name), Error()).Block(
			If(List(Id("v"), Id("ok")).Op(":=").Id("m").Dot(accessor(c)).Call(), Id("ok").Op("&&").Id("v").Op("!=").Nil()).Block(
				Return(Id("v"), Nil()),
			),
			Return(Nil(), Op("&").Id(contractError).Values(Dict{
				Id("Op"):        Lit(name),
				Id("Kind"):      Id("ErrUnsupported"),
				Id("Mechanism"): Id("m").Dot("Info").Call().Dot("Mechanism"),
				Id("Detail"):    Lit("mechanism does not offer " + c.Name),
			})),
		)
	}
}

// emitHandles writes handles.go: the Handle interface and the header every
// handle embeds, a type per spec handle, the Issuer that creates them and
// the checks that retire them.
func emitHandles(g *generator) {
	f := g.contractFile("handles.go")
	emitHandleBase(f)
	for _, t := range g.Spec.handles() {
		emitHandleType(g, f, t)
	}
	emitIssuer(g, f)
	emitHandleChecks(f)
}

// emitHandleBase writes Handle, the header every handle embeds (id,
// creator, state, the mechanism's impl, the charged bytes) and the counters
// ids come from.
func emitHandleBase(f *File) {
	comment(f, `Handle is what every handle type has in common. Handles are created only
by an Issuer, record the mechanism instance that created them, and move once
from live to released; a released handle stays released.`)
	f.Type().Id(contractHandle).Interface(
		Comment("ID returns the handle's process-unique id (0 for a nil handle)."),
		Id("ID").Params().Id("HandleID"),
		Comment("Creator returns the instance that created the handle."),
		Id("Creator").Params().Id("InstanceID"),
		Comment("Live reports whether the handle has not been released (nor is being released)."),
		Id("Live").Params().Bool(),
		Id("header").Params().Op("*").Id("handleHeader"),
	)
	f.Const().Defs(
		Id("stateLive").Uint32().Op("=").Iota(),
		Id("stateReleasing"),
		Id("stateReleased"),
	)
	f.Type().Id("handleHeader").Struct(
		Id("id").Id("HandleID"),
		Id("creator").Id("InstanceID"),
		Id("state").Qual("sync/atomic", "Uint32"),
		Id("impl").Any(),
		Id("charged").Qual("sync/atomic", "Uint64").Comment("committed bytes the checked wrapper charged against the handle (ChargeBook)"),
	)
	f.Var().Defs(
		Id("nextHandle").Qual("sync/atomic", "Uint64"),
		Id("nextInstance").Qual("sync/atomic", "Uint64"),
	)
}

// emitHandleType writes the type of spec handle t: its fields behind
// accessors, and ID, Creator, Live and String.
func emitHandleType(g *generator, f *File, t *typeDecl) {
	r := strings.ToLower(t.Name[:1])
	comment(f, docComment(t.Name, t.Doc)+"\n\n"+strings.ToUpper(article(t.Name)[:1])+article(t.Name)[1:]+" "+t.Name+" is made only by Issuer.New"+t.Name+"; its fields are read through methods.")
	f.Type().Id(t.Name).StructFunc(func(s *Group) {
		s.Id("hdr").Id("handleHeader")
		for _, fd := range t.Fields {
			s.Id(fieldName(fd.Name)).Add(g.Type(fd.Type))
		}
	})
	for _, fd := range t.Fields {
		comment(f, fd.Name+" returns the handle's "+words(fd.Name)+".")
		f.Func().Params(Id(r).Op("*").Id(t.Name)).Id(fd.Name).Params().Add(g.Type(fd.Type)).Block(
			Return(Id(r).Dot(fieldName(fd.Name))),
		)
	}
	f.Func().Params(Id(r).Op("*").Id(t.Name)).Id("header").Params().Op("*").Id("handleHeader").Block(
		If(Id(r).Op("==").Nil()).Block(Return(Nil())),
		Return(Op("&").Id(r).Dot("hdr")),
	)
	comment(f, "ID returns the handle's process-unique id, 0 for nil.")
	f.Func().Params(Id(r).Op("*").Id(t.Name)).Id("ID").Params().Id("HandleID").Block(
		If(Id(r).Op("==").Nil()).Block(Return(Lit(0))),
		Return(Id(r).Dot("hdr").Dot("id")),
	)
	comment(f, "Creator returns the instance that created the handle, 0 for nil.")
	f.Func().Params(Id(r).Op("*").Id(t.Name)).Id("Creator").Params().Id("InstanceID").Block(
		If(Id(r).Op("==").Nil()).Block(Return(Lit(0))),
		Return(Id(r).Dot("hdr").Dot("creator")),
	)
	comment(f, "Live reports whether the handle is neither released nor being released.")
	f.Func().Params(Id(r).Op("*").Id(t.Name)).Id("Live").Params().Bool().Block(
		Return(Id(r).Op("!=").Nil().Op("&&").Id(r).Dot("hdr").Dot("state").Dot("Load").Call().Op("==").Id("stateLive")),
	)
	f.Func().Params(Id(r).Op("*").Id(t.Name)).Id("String").Params().String().Block(
		If(Id(r).Op("==").Nil()).Block(Return(Lit(t.Name+"(nil)"))),
		Return(Qual("fmt", "Sprintf").Call(Lit(t.Name+"#%d(instance %d)"), Id(r).Dot("hdr").Dot("id"), Id(r).Dot("hdr").Dot("creator"))),
	)
	f.Line()
}

// emitIssuer writes Issuer, NewIssuer and a New<Handle> constructor per
// handle type.
func emitIssuer(g *generator, f *File) {
	comment(f, `Issuer creates the handles of one mechanism instance and is the only way to
retire them. A mechanism keeps its Issuer private, so no other code can
release its handles; Check and BeginRelease enforce release-by-creator and
detect double release and use after release on the bare mechanism too.`)
	f.Type().Id(contractIssuer).Struct(Id("instance").Id("InstanceID"))
	comment(f, "NewIssuer returns an Issuer with a fresh, process-unique InstanceID.")
	f.Func().Id(contractNewIssuer).Params().Op("*").Id(contractIssuer).Block(
		Return(Op("&").Id(contractIssuer).Values(Dict{Id("instance"): Id("InstanceID").Call(Id("nextInstance").Dot("Add").Call(Lit(1)))})),
	)
	comment(f, "Instance returns the instance id the Issuer stamps on its handles.")
	f.Func().Params(Id("i").Op("*").Id(contractIssuer)).Id("Instance").Params().Id("InstanceID").Block(Return(Id("i").Dot("instance")))
	for _, t := range g.Spec.handles() {
		var params []Code
		vals := Dict{Id("hdr"): Id("handleHeader").Values(Dict{
			Id("id"):      Id("HandleID").Call(Id("nextHandle").Dot("Add").Call(Lit(1))),
			Id("creator"): Id("i").Dot("instance"),
			Id("impl"):    Id("impl"),
		})}
		for _, fd := range t.Fields {
			n := fieldName(fd.Name)
			params = append(params, Id(n).Add(g.Type(fd.Type)))
			vals[Id(n)] = Id(n)
		}
		params = append(params, Id("impl").Any())
		comment(f, "New"+t.Name+" creates a live "+t.Name+" stamped with the Issuer's instance; impl is the\nmechanism's private state, returned by Impl and BeginRelease.")
		f.Func().Params(Id("i").Op("*").Id(contractIssuer)).Id("New" + t.Name).Params(params...).Op("*").Id(t.Name).Block(
			Return(Op("&").Id(t.Name).Values(vals)),
		)
	}
}

// emitHandleChecks writes CheckHandle and the Issuer's methods that check
// and retire its handles: Check, Impl, BeginRelease, EndRelease, Retire.
func emitHandleChecks(f *File) {
	comment(f, `CheckHandle returns nil when h is a live handle created by instance, and
otherwise an *Error of kind ErrNilHandle, ErrForeignHandle or ErrReleased.`)
	f.Func().Id(contractCheckHandle).Params(Id("op").String(), Id("h").Id(contractHandle), Id("instance").Id("InstanceID")).Error().Block(
		Var().Id("hd").Op("*").Id("handleHeader"),
		If(Id("h").Op("!=").Nil()).Block(Id("hd").Op("=").Id("h").Dot("header").Call()),
		Switch().Block(
			Case(Id("hd").Op("==").Nil()).Block(
				Return(Op("&").Id(contractError).Values(Dict{Id("Op"): Id("op"), Id("Kind"): Id("ErrNilHandle")})),
			),
			Case(Id("hd").Dot("creator").Op("!=").Id("instance")).Block(
				Return(Op("&").Id(contractError).Values(Dict{Id("Op"): Id("op"), Id("Kind"): Id("ErrForeignHandle"), Id("Handle"): Id("hd").Dot("id"),
					Id("Detail"): Qual("fmt", "Sprintf").Call(Lit("created by instance %d, not %d"), Id("hd").Dot("creator"), Id("instance"))})),
			),
			Case(Id("hd").Dot("state").Dot("Load").Call().Op("!=").Id("stateLive")).Block(
				Return(Op("&").Id(contractError).Values(Dict{Id("Op"): Id("op"), Id("Kind"): Id("ErrReleased"), Id("Handle"): Id("hd").Dot("id")})),
			),
		),
		Return(Nil()),
	)
	comment(f, "Check is CheckHandle for the Issuer's own instance.")
	f.Func().Params(Id("i").Op("*").Id(contractIssuer)).Id("Check").Params(Id("op").String(), Id("h").Id(contractHandle)).Error().Block(
		Return(Id(contractCheckHandle).Call(Id("op"), Id("h"), Id("i").Dot("instance"))),
	)
	comment(f, "Impl checks h and returns the private state it was created with.")
	f.Func().Params(Id("i").Op("*").Id(contractIssuer)).Id("Impl").Params(Id("op").String(), Id("h").Id(contractHandle)).Params(Any(), Error()).Block(
		If(Err().Op(":=").Id(contractCheckHandle).Call(Id("op"), Id("h"), Id("i").Dot("instance")), Err().Op("!=").Nil()).Block(Return(Nil(), Err())),
		Return(Id("h").Dot("header").Call().Dot("impl"), Nil()),
	)
	comment(f, `BeginRelease checks h and moves it from live to releasing, so that a
concurrent second release fails with ErrReleased. The mechanism then frees
the memory and calls EndRelease with the outcome.`)
	f.Func().Params(Id("i").Op("*").Id(contractIssuer)).Id("BeginRelease").Params(Id("op").String(), Id("h").Id(contractHandle)).Params(Any(), Error()).Block(
		If(Err().Op(":=").Id(contractCheckHandle).Call(Id("op"), Id("h"), Id("i").Dot("instance")), Err().Op("!=").Nil()).Block(Return(Nil(), Err())),
		Id("hd").Op(":=").Id("h").Dot("header").Call(),
		If(Op("!").Id("hd").Dot("state").Dot("CompareAndSwap").Call(Id("stateLive"), Id("stateReleasing"))).Block(
			Return(Nil(), Op("&").Id(contractError).Values(Dict{Id("Op"): Id("op"), Id("Kind"): Id("ErrReleased"), Id("Handle"): Id("hd").Dot("id")})),
		),
		Return(Id("hd").Dot("impl"), Nil()),
	)
	comment(f, "EndRelease finishes BeginRelease: released when ok, live again when the\nfree failed and the memory is still held.")
	f.Func().Params(Id("i").Op("*").Id(contractIssuer)).Id("EndRelease").Params(Id("h").Id(contractHandle), Id("ok").Bool()).Block(
		Id("hd").Op(":=").Id("h").Dot("header").Call(),
		If(Id("hd").Op("==").Nil().Op("||").Id("hd").Dot("creator").Op("!=").Id("i").Dot("instance")).Block(Return()),
		If(Id("ok")).Block(
			Id("hd").Dot("state").Dot("Store").Call(Id("stateReleased")),
		).Else().Block(
			Id("hd").Dot("state").Dot("CompareAndSwap").Call(Id("stateReleasing"), Id("stateLive")),
		),
	)
	comment(f, "Retire marks a live handle released without freeing anything: for a handle\nwhose memory another call already took over (a view replaced by CopyOnWrite).")
	f.Func().Params(Id("i").Op("*").Id(contractIssuer)).Id("Retire").Params(Id("op").String(), Id("h").Id(contractHandle)).Error().Block(
		If(List(Id("_"), Err()).Op(":=").Id("i").Dot("BeginRelease").Call(Id("op"), Id("h")), Err().Op("!=").Nil()).Block(Return(Err())),
		Id("i").Dot("EndRelease").Call(Id("h"), True()),
		Return(Nil()),
	)
}

// emitRanges copies contracttmpl/ranges.go, Range's methods and RoundUp,
// which do not vary with the spec.
func emitRanges(g *generator) error {
	tmpls, err := g.renderTemplates(templates, "contracttmpl/ranges.go", "memapi")
	if err != nil {
		return err
	}
	for _, t := range tmpls {
		g.Raw(g.Spec.Packages.Contract+"/"+t.name, t.src)
	}
	return nil
}

// emitInjector copies contracttmpl/inject.go, the fault injector every layer
// consults, and its tests, which do not vary with the spec.
func emitInjector(g *generator) error {
	tmpls, err := g.renderTemplates(templates, "contracttmpl/inject*.go", "memapi")
	if err != nil {
		return err
	}
	for _, t := range tmpls {
		g.Raw(g.Spec.Packages.Contract+"/"+t.name, t.src)
	}
	return nil
}

// emitMeta writes meta.go: the spec as data (Meta) with its types, the
// Effect enum its methods carry, and the lookups by invariant and mechanism.
func emitMeta(g *generator) {
	f := g.contractFile("meta.go")
	emitEffect(f)
	emitMetaTypes(f)
	s := g.Spec
	comment(f, "Meta is the spec these files were generated from.")
	f.Var().Id("Meta").Op("=").Id("SpecMeta").Values(Dict{
		Id("Digest"):       Id(contractSpecDigest),
		Id("Capabilities"): Index().Id("CapabilityMeta").Values(capabilityMetas(s)...),
		Id("Mechanisms"):   Index().Id("MechanismMeta").Values(mechanismMetas(s)...),
		Id("Invariants"):   Index().Id("InvariantMeta").Values(invariantMetas(s)...),
	})
	emitMetaLookups(f)
}

// emitEffect writes Effect, a method's effect on the ledger, with a
// constant per effect.
func emitEffect(f *File) {
	comment(f, "Effect is a method's effect on the ledger.")
	f.Type().Id("Effect").Uint8()
	effects := []string{effectNone, effectQuery, effectConsumes, effectRefunds}
	f.Const().DefsFunc(func(d *Group) {
		for i, e := range effects {
			if i == 0 {
				d.Id(effectConst(e)).Id("Effect").Op("=").Iota()
			} else {
				d.Id(effectConst(e))
			}
		}
	})
	f.Func().Params(Id("e").Id("Effect")).Id("String").Params().String().Block(
		Return(Index(Op("...")).String().ValuesFunc(func(v *Group) {
			for _, e := range effects {
				v.Lit(e)
			}
		}).Index(Id("e"))),
	)
}

// emitMetaTypes writes the types of Meta: SpecMeta and the meta of a
// method, a capability, a mechanism and an invariant.
func emitMetaTypes(f *File) {
	comment(f, "MethodMeta is one method of a capability as the spec declares it.")
	f.Type().Id("MethodMeta").Struct(
		Id("Capability").Id(contractCapability),
		Id("Name").String(),
		Id("Doc").String(),
		Id("Effect").Id("Effect"),
		Id("Amount").String().Comment("expression of the bytes consumed or refunded"),
		Id("Round").String().Comment("none, alloc or granularity"),
		Id("Account").String().Comment("the grant or account parameter"),
		Id("Creates").String().Comment("handle type created"),
		Id("Releases").String().Comment("parameter released"),
		Id("Requires").Index().String(),
	)
	comment(f, "CapabilityMeta is one capability as the spec declares it.")
	f.Type().Id("CapabilityMeta").Struct(
		Id("Capability").Id(contractCapability),
		Id("Name").String(),
		Id("Required").Bool(),
		Id("Doc").String(),
		Id("Methods").Index().Id("MethodMeta"),
	)
	comment(f, "MechanismMeta is one mechanism as the spec declares it.")
	f.Type().Id("MechanismMeta").Struct(
		Id("Name").Id("MechanismID"),
		Id("Package").String(),
		Id("Type").String(),
		Id("Device").String(),
		Id("Offers").Id(contractCapSet),
		Id("Granularity").String(),
		Id("Doc").String(),
	)
	comment(f, "InvariantMeta is one invariant of the spec (its invariants section): a rule, where it is enforced and what it applies to.")
	f.Type().Id("InvariantMeta").Struct(
		Id("ID").String(),
		Id("Says").String(),
		Id("EnforcedBy").Index().String(),
		Id("Consumes").Bool().Comment("applies to every consuming method"),
		Id("Releases").Bool().Comment("applies to every releasing method"),
		Id("Capabilities").Index().String(),
		Id("Interfaces").Index().String(),
	)
	comment(f, "SpecMeta is the spec as data, for the layers above and for docs.")
	f.Type().Id("SpecMeta").Struct(
		Id("Digest").String(),
		Id("Capabilities").Index().Id("CapabilityMeta"),
		Id("Mechanisms").Index().Id("MechanismMeta"),
		Id("Invariants").Index().Id("InvariantMeta"),
	)
}

// strs is a []string literal, nil when empty.
func strs(xs []string) Code {
	if len(xs) == 0 {
		return Nil()
	}
	return Index().String().ValuesFunc(func(v *Group) {
		for _, x := range xs {
			v.Lit(x)
		}
	})
}

// capabilityMetas are Meta's capabilities, each with its methods.
func capabilityMetas(s *Spec) []Code {
	var out []Code
	for _, c := range s.Capabilities {
		out = append(out, Values(Dict{
			Id("Capability"): Id(capConst(c)),
			Id("Name"):       Lit(c.Name),
			Id("Required"):   Lit(c.Required),
			Id("Doc"):        longLit(c.Doc),
			Id("Methods"): Index().Id("MethodMeta").ValuesFunc(func(mv *Group) {
				for _, m := range c.Methods {
					a := m.Accounting
					amount := ""
					if a.Amount != nil {
						amount = a.Amount.Text
					}
					var req []string
					for _, r := range m.Requires {
						req = append(req, r.Text)
					}
					mv.Values(Dict{
						Id("Capability"): Id(capConst(c)),
						Id("Name"):       Lit(m.Name),
						Id("Doc"):        longLit(m.Doc),
						Id("Effect"):     Id(effectConst(a.Effect)),
						Id("Amount"):     Lit(amount),
						Id("Round"):      Lit(a.Round),
						Id("Account"):    Lit(a.Account),
						Id("Creates"):    Lit(m.Creates),
						Id("Releases"):   Lit(m.Releases),
						Id("Requires"):   strs(req),
					})
				}
			}),
		}))
	}
	return out
}

// mechanismMetas are Meta's mechanisms.
func mechanismMetas(s *Spec) []Code {
	var out []Code
	for _, m := range s.Mechanisms {
		var offers []Code
		for _, o := range m.Offers {
			offers = append(offers, Id(capConst(s.Capability(o))))
		}
		out = append(out, Values(Dict{
			Id("Name"):        Lit(m.Name),
			Id("Package"):     Lit(m.Package),
			Id("Type"):        Lit(m.Type),
			Id("Device"):      Lit(m.Device),
			Id("Offers"):      Id(contractOf).Call(offers...),
			Id("Granularity"): Lit(m.Granularity),
			Id("Doc"):         longLit(m.Doc),
		}))
	}
	return out
}

// invariantMetas are Meta's invariants.
func invariantMetas(s *Spec) []Code {
	var out []Code
	for _, iv := range s.Invariants {
		out = append(out, Values(Dict{
			Id("ID"):           Lit(iv.ID),
			Id("Says"):         longLit(iv.Says),
			Id("EnforcedBy"):   strs(iv.EnforcedBy),
			Id("Consumes"):     Lit(iv.Applies.Consumes),
			Id("Releases"):     Lit(iv.Applies.Releases),
			Id("Capabilities"): strs(iv.Applies.Capabilities),
			Id("Interfaces"):   strs(iv.Applies.Interfaces),
		}))
	}
	return out
}

// emitMetaLookups writes Invariant and MechanismSpec, which find an entry of
// Meta.
func emitMetaLookups(f *File) {
	comment(f, "Invariant returns the invariant with the given id.")
	f.Func().Id("Invariant").Params(Id("id").String()).Params(Id("InvariantMeta"), Bool()).Block(
		For(List(Id("_"), Id("iv")).Op(":=").Range().Id("Meta").Dot("Invariants")).Block(
			If(Id("iv").Dot("ID").Op("==").Id("id")).Block(Return(Id("iv"), True())),
		),
		Return(Id("InvariantMeta").Values(), False()),
	)
	comment(f, "MechanismSpec returns the declaration of the named mechanism.")
	f.Func().Id("MechanismSpec").Params(Id("name").Id("MechanismID")).Params(Id("MechanismMeta"), Bool()).Block(
		For(List(Id("_"), Id("m")).Op(":=").Range().Id("Meta").Dot("Mechanisms")).Block(
			If(Id("m").Dot("Name").Op("==").Id("name")).Block(Return(Id("m"), True())),
		),
		Return(Id("MechanismMeta").Values(), False()),
	)
}

func emitTripwire(g *generator) {
	f := g.File(g.Spec.Packages.Contract+"/digest_test.go", "memapi")
	depth := strings.Count(g.Spec.Packages.Contract, "/") + 1
	rel := strings.Repeat("../", depth) + g.Spec.File
	comment(f, "TestSpecDigest is the tripwire: it fails when the spec changed after these\nfiles were generated. Run go generate ./... to bring them up to date.")
	f.Func().Id("TestSpecDigest").Params(Id("t").Op("*").Qual("testing", "T")).Block(
		List(Id("data"), Err()).Op(":=").Qual("os", "ReadFile").Call(Lit(rel)),
		If(Err().Op("!=").Nil()).Block(Id("t").Dot("Fatalf").Call(Lit("read spec: %v"), Err())),
		Id("sum").Op(":=").Qual("crypto/sha256", "Sum256").Call(Id("data")),
		If(Id("got").Op(":=").Qual("encoding/hex", "EncodeToString").Call(Id("sum").Index(Op(":"))), Id("got").Op("!=").Id(contractSpecDigest)).Block(
			Id("t").Dot("Fatalf").Call(Lit("generated code is older than "+g.Spec.File+" (digest %s, generated from %s): run go generate ./..."), Id("got"), Id(contractSpecDigest)),
		),
	)
}
