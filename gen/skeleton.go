package gen

import (
	"fmt"
	"path"
	"strings"

	. "github.com/dave/jennifer/jen"
)

// Skeleton returns the hand-written starting point of the spec's mechanism
// name (what `memgen new mechanism` writes), keyed by module-relative slash
// path: the package's doc.go; mechanism.go with Options, New, Info, the
// offers hook when the mechanism offers an optional capability, and the
// methods of DeviceAllocator; a file per optional capability it offers; a
// device context (context.go); and conformance_test.go, which runs the
// generated suite on it bare and through the checked wrapper.
//
// The files carry no generated header: they are the author's from the
// start. Every method the author must write returns a typed error
// (memapi.ErrUnsupported) saying that it is not written yet and where to
// write it, so the package compiles, memgen check passes, and the suite
// fails naming each such method until it is written; nothing reports a
// success it did not earn. UsedBytes reports 0, which is true of a
// mechanism whose Allocate holds nothing.
func Skeleton(s *Spec, cfg Config, name string) (map[string][]byte, error) {
	var m *Mechanism
	for _, c := range s.Mechanisms {
		if c.Name == name {
			m = c
		}
	}
	if m == nil {
		return nil, fmt.Errorf("the spec declares no mechanism %q", name)
	}
	g := newGen(s, cfg)
	sk := &skeleton{g: g, m: m, pkg: path.Base(m.Package)}
	sk.doc()
	sk.mechanism()
	for _, c := range s.Capabilities {
		if !c.Required && sk.offers(c.Name) {
			sk.capability(c)
		}
	}
	sk.context()
	sk.conformance()
	out := g.render()
	if len(g.errs.list) > 0 {
		return nil, g.errs.list.sorted()
	}
	return out, nil
}

// skeleton writes the files of one mechanism's starting point.
type skeleton struct {
	g   *generator
	m   *Mechanism
	pkg string // the Go package name
}

// file returns a new file of the mechanism's package without the generated
// header.
func (sk *skeleton) file(name string) *File {
	f := NewFilePathName(sk.g.Import(sk.m.Package), sk.pkg)
	sk.g.jfiles[sk.m.Package+"/"+name] = f
	return f
}

func (sk *skeleton) offers(c string) bool {
	for _, o := range sk.m.Offers {
		if o == c {
			return true
		}
	}
	return false
}

// optional reports whether the mechanism offers an optional capability.
func (sk *skeleton) optional() bool {
	for _, c := range sk.g.Spec.Capabilities {
		if !c.Required && sk.offers(c.Name) {
			return true
		}
	}
	return false
}

func (sk *skeleton) doc() {
	f := sk.file("doc.go")
	text := fmt.Sprintf(`Package %s is mechanism %q of the spec: %s

memgen new wrote this starting point. Read it in this order: mechanism.go
(Options, New, Info and the DeviceAllocator methods every mechanism writes),
a file per optional capability the spec declares for it, context.go (the
device context the conformance suite reads and writes memory through), and
conformance_test.go. Every method still to be written returns an error of
kind memapi.ErrUnsupported saying so; go test runs the generated
conformance suite and fails naming each until it is written.
mechanisms/example is a complete mechanism to read beside it.`, sk.pkg, sk.m.Name, sk.m.Doc)
	for i, para := range strings.Split(text, "\n\n") {
		if i > 0 {
			f.PackageComment("//")
		}
		for _, l := range strings.Split(wrapText(strings.Join(strings.Fields(para), " "), commentWidth-3), "\n") {
			f.PackageComment("// " + l)
		}
	}
}

func (sk *skeleton) mechanism() {
	g, m := sk.g, sk.m
	f := sk.file("mechanism.go")
	f.Comment("Options configure a " + m.Type + ".")
	f.Type().Id("Options").Struct(
		Comment("Authority is the accounting scope the mechanism's memory is charged"),
		Comment(`to; "host" when empty.`),
		Id("Authority").Add(g.C("AuthorityID")),
	)
	comment(f, fmt.Sprintf("%s is mechanism %s. Create handles with its Issuer (NewAllocation, BeginRelease, EndRelease): that gives release-by-creator, double-release and foreign-handle errors for free. Never draw from a grant or refund an account: the checked wrapper does, around each call.", m.Type, m.Name))
	f.Type().Id(m.Type).Struct(
		Id("iss").Op("*").Add(g.C(contractIssuer)),
		Id("info").Add(g.C("MechanismInfo")),
	)
	var gran string
	switch m.Granularity {
	case "configurable":
		gran = "the host page size until an option chooses another (the spec declares it configurable: a power of two, a multiple of the page)"
	case "device":
		gran = "the host page size until the device is asked (the spec declares it the device's: a power of two)"
	default:
		gran = "the host page size (the spec declares it page)"
	}
	comment(f, "New returns a mechanism with a fresh instance id. Its granularities are "+gran+".")
	f.Func().Id("New").Params(Id("o").Id("Options")).Op("*").Id(m.Type).Block(
		If(Id("o").Dot("Authority").Op("==").Lit("")).Block(Id("o").Dot("Authority").Op("=").Lit("host")),
		Id("page").Op(":=").Add(g.C("Bytes")).Call(Qual("os", "Getpagesize").Call()),
		Id("iss").Op(":=").Add(g.C(contractNewIssuer)).Call(),
		Return(Op("&").Id(m.Type).Values(Dict{
			Id("iss"): Id("iss"),
			Id("info"): g.C("MechanismInfo").Values(Dict{
				Id("Mechanism"):        Id(glueSpecName),
				Id("Instance"):         Id("iss").Dot("Instance").Call(),
				Id("Device"):           g.C("DeviceKey").Values(Dict{Id("Kind"): g.C("DeviceKind" + m.Device)}),
				Id("Authority"):        Id("o").Dot("Authority"),
				Id("AllocGranularity"): Id("page"),
				Id("Granularity"):      Id("page"),
			}),
		})),
	)
	if sk.optional() {
		comment(f, "offers is the hook the generated accessors ask: whether this instance offers c now (a device may lack a feature at run time).")
		f.Func().Params(Id("m").Op("*").Id(m.Type)).Id(glueOffers).Params(Id("c").Add(g.C(contractCapability))).Bool().Block(Return(True()))
	}
	f.Comment("Info describes the instance; it never changes.")
	f.Func().Params(Id("m").Op("*").Id(m.Type)).Id("Info").Params().Add(g.C("MechanismInfo")).Block(Return(Id("m").Dot("info")))
	f.Comment("UsedBytes reports the bytes the mechanism holds: none until Allocate")
	f.Comment("is written.")
	f.Func().Params(Id("m").Op("*").Id(m.Type)).Id("UsedBytes").Params().Add(g.C("Bytes")).Block(Return(Lit(0)))
	for _, c := range g.Spec.Capabilities {
		if c.Required {
			sk.methods(f, c, "mechanism.go", "Info", "UsedBytes")
		}
	}
	comment(f, "notWritten is the error of a method still to be written: unsupported, naming the method and where to write it, never a success.")
	f.Func().Params(Id("m").Op("*").Id(m.Type)).Id("notWritten").Params(Id("op"), Id("file").String()).Error().Block(
		Id("e").Op(":=").Add(g.C(contractErrorf)).Call(Id("op"), g.C("ErrUnsupported"),
			Lit("not written yet: memgen new wrote a starting point; write %s in "+m.Package+"/%s"), Id("op"), Id("file")),
		List(Id("e").Dot("Mechanism"), Id("e").Dot("Authority")).Op("=").List(Id("m").Dot("info").Dot("Mechanism"), Id("m").Dot("info").Dot("Authority")),
		Return(Id("e")),
	)
}

// methods writes c's methods (but those in skip) on the mechanism's type,
// each returning notWritten.
func (sk *skeleton) methods(f *File, c *capability, file string, skip ...string) {
	g := sk.g
outer:
	for _, mt := range c.Methods {
		for _, s := range skip {
			if mt.Name == s {
				continue outer
			}
		}
		params, results := g.Signature(mt)
		var ret []Code
		for _, r := range mt.Returns {
			if r.Type == "error" {
				ret = append(ret, Id("m").Dot("notWritten").Call(Lit(c.Name+"."+mt.Name), Lit(file)))
			} else {
				ret = append(ret, g.Zero(r.Type))
			}
		}
		doc := firstSentence(mt.Doc)
		if !strings.HasPrefix(doc, mt.Name+" ") {
			doc = mt.Name + ": " + doc
		}
		comment(f, doc+" Not written yet.")
		for i := range params {
			params[i] = Id("_").Add(g.Type(mt.Params[i].Type))
		}
		f.Func().Params(Id("m").Op("*").Id(sk.m.Type)).Id(mt.Name).Params(params...).Params(results...).Block(Return(ret...))
	}
}

// firstSentence is the first sentence of a doc string, for a method's
// comment.
func firstSentence(doc string) string {
	doc = strings.Join(strings.Fields(doc), " ")
	if i := strings.Index(doc, ". "); i >= 0 {
		return doc[:i+1]
	}
	return doc
}

func (sk *skeleton) capability(c *capability) {
	file := strings.ToLower(c.Name) + ".go"
	f := sk.file(file)
	comment(f, fmt.Sprintf("The %s methods of %s: the spec declares that it offers %s.", c.Name, sk.m.Type, c.Name))
	f.Line()
	sk.methods(f, c, file)
}

func (sk *skeleton) context() {
	g, m := sk.g, sk.m
	f := sk.file("context.go")
	comment(f, fmt.Sprintf("Context is %s's device context: streams whose copies move bytes between Go slices and the memory behind the mechanism's addresses, and fences that say when they are done. The conformance suite reads and writes memory through it.", m.Type))
	f.Type().Id("Context").Struct(Id("m").Op("*").Id(m.Type))
	f.Var().Id("_").Add(g.C("DeviceContext")).Op("=").Parens(Op("*").Id("Context")).Parens(Nil())
	f.Comment("NewContext returns a device context over the memory of m.")
	f.Func().Id("NewContext").Params(Id("m").Op("*").Id(m.Type)).Op("*").Id("Context").Block(Return(Op("&").Id("Context").Values(Dict{Id("m"): Id("m")})))
	f.Comment("Device returns the mechanism's device.")
	f.Func().Params(Id("c").Op("*").Id("Context")).Id("Device").Params().Add(g.C("DeviceKey")).Block(Return(Id("c").Dot("m").Dot("info").Dot("Device")))
	f.Comment("NewStream returns a new stream (memapi.Stream: copies, Record, Synchronize, Close).")
	f.Func().Params(Id("c").Op("*").Id("Context")).Id("NewStream").Params().Params(g.C("Stream"), Error()).Block(
		Return(Nil(), Id("c").Dot("m").Dot("notWritten").Call(Lit("DeviceContext.NewStream"), Lit("context.go"))),
	)
	f.Comment("Close releases the context; it holds nothing until NewStream is written.")
	f.Func().Params(Id("c").Op("*").Id("Context")).Id("Close").Params().Error().Block(Return(Nil()))
}

func (sk *skeleton) conformance() {
	g, m := sk.g, sk.m
	f := NewFilePathName(g.Import(m.Package), sk.pkg)
	g.jfiles[m.Package+"/conformance_test.go"] = f
	comment(f, "TestConformance runs the generated conformance suite on the mechanism, bare and through the checked wrapper in verify mode: the factory makes a fresh mechanism and its device context for every subtest.")
	checked := g.Import(g.Spec.Packages.Checked)
	conf := g.Import(g.Spec.Packages.Conformance)
	f.Func().Id("TestConformance").Params(Id("t").Op("*").Qual("testing", "T")).Block(
		For(List(Id("_"), Id("wrapped")).Op(":=").Range().Index().Bool().Values(False(), True())).Block(
			Id("name").Op(":=").Lit("bare"),
			If(Id("wrapped")).Block(Id("name").Op("=").Lit("checked")),
			Id("t").Dot("Run").Call(Id("name"), Func().Params(Id("t").Op("*").Qual("testing", "T")).Block(
				Qual(conf, "Run").Call(Id("t"), Func().Params(Id("t").Op("*").Qual("testing", "T")).Qual(conf, "Subject").Block(
					Id("m").Op(":=").Id("New").Call(Id("Options").Values()),
					Id("c").Op(":=").Id("NewContext").Call(Id("m")),
					Id("t").Dot("Cleanup").Call(Func().Params().Block(
						If(Err().Op(":=").Id("c").Dot("Close").Call(), Err().Op("!=").Nil()).Block(
							Id("t").Dot("Errorf").Call(Lit("context close: %v"), Err()),
						),
					)),
					Var().Id("mech").Add(g.C(contractMechanism)).Op("=").Id("m"),
					If(Id("wrapped")).Block(
						Id("mech").Op("=").Qual(checked, checkedWrap).Call(Id("m"), Qual(conf, "Ledger"), Qual(checked, checkedWithVerify).Call()),
					),
					Return(Qual(conf, "Subject").Values(Dict{Id("Mechanism"): Id("mech"), Id("Context"): Id("c")})),
				)),
			)),
		),
	)
}
