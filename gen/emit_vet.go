package gen

import (
	. "github.com/dave/jennifer/jen"
)

// vetEmitter writes the contract's vet.go.
var vetEmitter = &emitter{Name: "contract-vet", Requires: []*emitter{contractEmitter}, Emit: noResult(emitVet)}

func init() { register(vetEmitter) }

// emitVet writes generated/memapi/vet.go: the part of the spec that
// cmd/memvet checks code against and that Meta does not already carry (the
// packages by role, the ledger interfaces, the negotiation helpers, the
// ownership section), as data, so that no analyzer keeps a list by hand.
func emitVet(g *generator) error {
	s := g.Spec
	f := g.contractFile("vet.go")
	comment(f, "VetMeta is what cmd/memvet checks code against, from the spec. Import\npaths are full; the consuming and refunding methods are in Meta.")
	f.Type().Id("VetMeta").Struct(
		Id("Module").String().Comment("the module the packages below belong to"),
		Id("Contract").String().Comment("the contract package"),
		Id("Checked").String().Comment("the checked wrappers: the only way to call a consuming or refunding method"),
		Id("Generated").Index().String().Comment("every package memgen writes"),
		Id("Mechanisms").Index().String().Comment("the hand-written mechanism packages"),
		Id("Ledgers").Index().String().Comment("the packages that may implement the grant and account roles"),
		Id("Grant").String().Comment("the contract interface of role grant"),
		Id("Account").String().Comment("the contract interface of role account"),
		Id("Stream").String().Comment("the contract interface of role stream: device work"),
		Id("Negotiators").Index().Id("NegotiatorMeta"),
		Id("OwningHandles").Index().Id("OwningHandleMeta"),
	)
	comment(f, "NegotiatorMeta names the two ways to reach an optional capability: the\nRequire helper (its error says unsupported) and the Mechanism accessor (its\nbool says absent).")
	f.Type().Id("NegotiatorMeta").Struct(
		Id("Capability").Id(contractCapability),
		Id("Require").String(),
		Id("Accessor").String(),
	)
	comment(f, "OwningHandleMeta is a type of the layers above the contract that owns\nmemory until its Close method runs (spec section ownership.handles).")
	f.Type().Id("OwningHandleMeta").Struct(
		Id("Package").String(),
		Id("Type").String(),
		Id("Close").String(),
	)
	imports := func(dirs []string) Code {
		if len(dirs) == 0 {
			return Nil()
		}
		var vs []Code
		for _, d := range dirs {
			vs = append(vs, Lit(g.Import(d)))
		}
		return Index().String().Values(vs...)
	}
	var mechs []string
	for _, m := range s.Mechanisms {
		mechs = append(mechs, m.Package)
	}
	comment(f, "Vet is the spec these files were generated from, as memvet reads it.")
	f.Var().Id("Vet").Op("=").Id("VetMeta").Values(Dict{
		Id("Module"):     Lit(g.Config.Module),
		Id("Contract"):   Lit(g.Contract()),
		Id("Checked"):    Lit(g.Import(s.Packages.Checked)),
		Id("Generated"):  imports([]string{s.Packages.Contract, s.Packages.Checked, s.Packages.Conformance, s.Packages.Fakes}),
		Id("Mechanisms"): imports(mechs),
		Id("Ledgers"):    imports(s.Ownership.Ledgers),
		Id("Grant"):      Lit(roleName(s, roleGrant)),
		Id("Account"):    Lit(roleName(s, roleAccount)),
		Id("Stream"):     Lit(roleName(s, roleStream)),
		Id("Negotiators"): Index().Id("NegotiatorMeta").ValuesFunc(func(v *Group) {
			for _, c := range s.Capabilities {
				if !c.Required {
					v.Values(Dict{
						Id("Capability"): Id(capConst(c)),
						Id("Require"):    Lit(requireFunc(c)),
						Id("Accessor"):   Lit(accessor(c)),
					})
				}
			}
		}),
		Id("OwningHandles"): Index().Id("OwningHandleMeta").ValuesFunc(func(v *Group) {
			for _, h := range s.Ownership.Handles {
				v.Values(Dict{
					Id("Package"): Lit(g.Import(h.Package)),
					Id("Type"):    Lit(h.Type),
					Id("Close"):   Lit(h.Close),
				})
			}
		}),
	})
	return nil
}

func roleName(s *Spec, role string) string {
	if i := s.roleInterface(role); i != nil {
		return i.Name
	}
	return ""
}

// The vet emitter's declarations join the contract's reserved names (kept in
// validate.go for the others): a spec type of one of these names would not
// compile.
func init() {
	reservedNames = append(reservedNames, "NegotiatorMeta", "OwningHandleMeta", "Vet", "VetMeta")
}
