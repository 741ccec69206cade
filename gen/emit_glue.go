package gen

import (
	. "github.com/dave/jennifer/jen"
)

func init() { register(Emitter{Name: "glue", Order: 10, Emit: emitGlue}) }

// emitGlue writes zz_generated.memgen.go into each hand-written mechanism
// package that exists: compile-time assertions that the type implements
// exactly what the spec declares, and the accessors of the optional
// capabilities. An offered capability's accessor asks the type's hand-written
// offers method, so a device that lacks a feature at run time (a GPU without
// VMM) reports it absent; a capability the spec does not declare for the
// mechanism has an accessor that always reports absence.
func emitGlue(g *Gen) error {
	for _, m := range g.Spec.Mechanisms {
		if !g.MechanismDirExists(m) {
			continue
		}
		f := g.File(m.Package+"/zz_generated.memgen.go", "")
		offered := map[string]bool{}
		for _, o := range m.Offers {
			offered[o] = true
		}
		comment(f, "The spec declares mechanism "+m.Name+": "+m.Doc)
		f.Var().DefsFunc(func(d *Group) {
			d.Id("_").Add(g.C("Mechanism")).Op("=").Parens(Op("*").Id(m.Type)).Parens(Nil())
			for _, c := range g.Spec.Capabilities {
				if offered[c.Name] {
					d.Id("_").Add(g.C(c.Name)).Op("=").Parens(Op("*").Id(m.Type)).Parens(Nil())
				}
			}
		})
		for _, c := range g.Spec.Capabilities {
			if c.Required {
				continue
			}
			recv := Id("m").Op("*").Id(m.Type)
			if offered[c.Name] {
				comment(f, Accessor(c)+" returns the "+c.Name+" capability when this instance offers it now.")
				f.Func().Params(recv).Id(Accessor(c)).Params().Params(g.C(c.Name), Bool()).Block(
					If(Op("!").Id("m").Dot("offers").Call(g.C(CapConst(c)))).Block(Return(Nil(), False())),
					Return(Id("m"), True()),
				)
			} else {
				comment(f, Accessor(c)+" reports that mechanism "+m.Name+" does not offer "+c.Name+": the spec does not declare it.")
				f.Func().Params(Id("_").Op("*").Id(m.Type)).Id(Accessor(c)).Params().Params(g.C(c.Name), Bool()).Block(
					Return(Nil(), False()),
				)
			}
		}
	}
	return nil
}
