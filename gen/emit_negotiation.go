package gen

import (
	. "github.com/dave/jennifer/jen"
)

// negotiationEmitter writes the contract's negotiate_test.go.
var negotiationEmitter = &emitter{Name: "contract-negotiation-test", Requires: []*emitter{contractEmitter}, Emit: noResult(emitNegotiationTest)}

func init() { register(negotiationEmitter) }

// emitNegotiationTest writes a test beside the contract: a mechanism that
// offers only the required capabilities must report every optional one
// absent, and each Require helper must return an *Error that matches
// errors.ErrUnsupported (invariant no-silent-noop).
func emitNegotiationTest(g *generator) error {
	f := g.File(g.Spec.Packages.Contract+"/negotiate_test.go", "memapi")
	comment(f, "requiredOnly offers the required capabilities and nothing else; its methods\nare never called by negotiation.")
	f.Type().Id("requiredOnly").Struct()
	for _, c := range g.Spec.Capabilities {
		if c.Required {
			for _, m := range c.Methods {
				params, results := g.Signature(m)
				f.Func().Params(Id("requiredOnly")).Id(m.Name).Params(params...).Params(results...).BlockFunc(func(b *Group) {
					if len(m.Returns) == 0 {
						return
					}
					var vals []Code
					for i, r := range m.Returns {
						if i == len(m.Returns)-1 && r.Type == "error" {
							vals = append(vals, Id("ErrUnsupported"))
						} else {
							vals = append(vals, g.Zero(r.Type))
						}
					}
					b.Return(vals...)
				})
			}
			continue
		}
		f.Func().Params(Id("requiredOnly")).Id(accessor(c)).Params().Params(Id(c.Name), Bool()).Block(Return(Nil(), False()))
	}
	comment(f, "TestNegotiateReportsAbsence checks that the optional capabilities a mechanism\ndoes not offer are absent from Negotiate, and that Require reports them as\nunsupported.")
	f.Func().Id("TestNegotiateReportsAbsence").Params(Id("t").Op("*").Qual("testing", "T")).BlockFunc(func(b *Group) {
		b.Var().Id("m").Id(contractMechanism).Op("=").Id("requiredOnly").Values()
		b.Id("got").Op(":=").Id(contractNegotiate).Call(Id("m"))
		for _, c := range g.Spec.Capabilities {
			if c.Required {
				b.If(Op("!").Id("got").Dot("Has").Call(Id(capConst(c)))).Block(
					Id("t").Dot("Errorf").Call(Lit("Negotiate = %v: required "+c.Name+" missing"), Id("got")),
				)
				continue
			}
			b.If(Id("got").Dot("Has").Call(Id(capConst(c)))).Block(
				Id("t").Dot("Errorf").Call(Lit("Negotiate = %v: "+c.Name+" reported although absent"), Id("got")),
			)
			b.If(List(Id("v"), Err()).Op(":=").Id(requireFunc(c)).Call(Id("m")), Id("v").Op("!=").Nil().Op("||").Op("!").Qual("errors", "Is").Call(Err(), Qual("errors", "ErrUnsupported"))).Block(
				Id("t").Dot("Errorf").Call(Lit(requireFunc(c)+" = %v, %v: want nil and an error matching errors.ErrUnsupported"), Id("v"), Err()),
			).Else().Block(
				Var().Id("e").Op("*").Id(contractError),
				If(Op("!").Qual("errors", "As").Call(Err(), Op("&").Id("e")).Op("||").Id("e").Dot("Op").Op("!=").Lit(requireFunc(c))).Block(
					Id("t").Dot("Errorf").Call(Lit(requireFunc(c)+": %v is not an *Error naming the operation"), Err()),
				),
			)
		}
	})
	return nil
}
