package gen

import (
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	. "github.com/dave/jennifer/jen"
)

// glueEmitter writes GlueFile into every mechanism's package.
var glueEmitter = &emitter{Name: "glue", Requires: []*emitter{contractEmitter}, Emit: noResult(emitGlue)}

func init() { register(glueEmitter) }

// GlueFile is the name of the file memgen writes into each mechanism's
// package.
const GlueFile = "zz_generated.memgen.go"

// The names the glue declares, or asks the hand-written half for, that
// memgen new's starting point (Skeleton) uses too.
const (
	glueSpecName = "SpecName" // the mechanism's key in the spec
	glueOffers   = "offers"   // the hand-written hook the optional capabilities' accessors ask
)

// emitGlue writes GlueFile into the package of every declared mechanism,
// whether or not the hand-written half exists yet: compile-time assertions
// that the type implements what the spec declares, and the accessors of the
// optional capabilities. Until the type is written the package does not
// compile, and the compiler's errors list what to write. An offered optional
// capability's accessor asks the type's hand-written offers method, so a
// device that lacks a feature at run time (a GPU without VMM) reports it
// absent; a capability the spec does not declare for the mechanism has an
// accessor that always reports absence.
func emitGlue(g *generator) error {
	for _, m := range g.Spec.Mechanisms {
		checkPackageClause(g, m)
		f := g.File(m.Package+"/"+GlueFile, "")
		offered := map[string]bool{}
		for _, o := range m.Offers {
			offered[o] = true
		}
		var optional []string
		for _, c := range g.Spec.Capabilities {
			if offered[c.Name] && !c.Required {
				optional = append(optional, c.Name)
			}
		}
		doc := "Mechanism " + m.Name + " is declared in the spec for this package. " + sentence(upperFirst(m.Doc)) + "\n\n" +
			"The hand-written half is type " + m.Type + ": *" + m.Type + " implements memapi.Mechanism and the capabilities below " +
			"(memgen check reports a capability it implements that the spec does not declare)."
		if len(optional) > 0 {
			doc += " Because it offers the optional " + strings.Join(optional, " and ") + ", *" + m.Type +
				" also has the method offers(memapi.Capability) bool, which says whether this instance offers a capability now " +
				"(a device may lack a feature at run time); the accessors below ask it."
		}
		comment(f, doc)
		comment(f, "SpecName is mechanism "+m.Name+"'s key in the spec: Info().Mechanism must report it. The\nconformance suite fails spec/name for a mechanism of this package that\nreports another name.")
		f.Const().Id(glueSpecName).Add(g.C("MechanismID")).Op("=").Lit(m.Name)
		f.Var().DefsFunc(func(d *Group) {
			d.Id("_").Add(g.C(contractMechanism)).Op("=").Parens(Op("*").Id(m.Type)).Parens(Nil())
			for _, c := range g.Spec.Capabilities {
				if offered[c.Name] {
					d.Id("_").Add(g.C(c.Name)).Op("=").Parens(Op("*").Id(m.Type)).Parens(Nil())
				}
			}
			if len(optional) > 0 {
				d.Id("_").Interface(Id(glueOffers).Params(g.C(contractCapability)).Bool()).Op("=").Parens(Op("*").Id(m.Type)).Parens(Nil())
			}
		})
		for _, c := range g.Spec.Capabilities {
			if c.Required {
				continue
			}
			recv := Id("m").Op("*").Id(m.Type)
			if offered[c.Name] {
				comment(f, accessor(c)+" returns the "+c.Name+" capability when this instance offers it now.")
				f.Func().Params(recv).Id(accessor(c)).Params().Params(g.C(c.Name), Bool()).Block(
					If(Op("!").Id("m").Dot(glueOffers).Call(g.C(capConst(c)))).Block(Return(Nil(), False())),
					Return(Id("m"), True()),
				)
			} else {
				comment(f, accessor(c)+" reports that mechanism "+m.Name+" does not offer "+c.Name+": the spec does not declare it.")
				f.Func().Params(Op("*").Id(m.Type)).Id(accessor(c)).Params().Params(g.C(c.Name), Bool()).Block(
					Return(Nil(), False()),
				)
			}
		}
	}
	return nil
}

// checkPackageClause reports a hand-written file of m's package whose package
// clause differs from the directory's last element: the glue is written in
// the package named after the directory, so the two would not build together.
func checkPackageClause(g *generator, m *Mechanism) {
	if g.Config.Root == "" {
		return
	}
	dir := filepath.Join(g.Config.Root, filepath.FromSlash(m.Package))
	ents, err := os.ReadDir(dir)
	if err != nil {
		return // not written yet
	}
	want := path.Base(m.Package)
	var bad []string
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || n == GlueFile {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, n), nil, parser.PackageClauseOnly)
		if err != nil {
			continue // the compiler reports it
		}
		got := f.Name.Name
		if got != want && !(strings.HasSuffix(n, "_test.go") && got == want+"_test") {
			bad = append(bad, n+" (package "+got+")")
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		g.Errorf(m.PackagePos, "mechanism %s: %s declares a package other than %s, the last element of %q, which the glue (%s) is written in: rename the package or the directory",
			m.Name, strings.Join(bad, ", "), want, m.Package, GlueFile)
	}
}
