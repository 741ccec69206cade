package gen

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"strings"
	"testing"
)

// checkedFuncs parses the generated checked package and returns the source
// of each function, keyed by "receiverType.Name" (or "Name").
func checkedFuncs(t *testing.T, s *Spec) map[string]string {
	t.Helper()
	files := emitOnly(t, s, checkedEmitter)
	fset := token.NewFileSet()
	out := map[string]string{}
	for rel, src := range files {
		if !strings.HasPrefix(rel, s.Packages.Checked+"/") || strings.HasSuffix(rel, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, rel, src, 0)
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			key := fd.Name.Name
			if fd.Recv != nil {
				key = strings.TrimPrefix(recvTypeName(fd.Recv.List[0].Type), "*") + "." + key
			}
			var b bytes.Buffer
			if err := printer.Fprint(&b, fset, fd); err != nil {
				t.Fatal(err)
			}
			out[key] = b.String()
		}
	}
	return out
}

func recvTypeName(e ast.Expr) string {
	if s, ok := e.(*ast.StarExpr); ok {
		return "*" + recvTypeName(s.X)
	}
	return e.(*ast.Ident).Name
}

// TestCheckedFollowsTheSpec: every capability method has one wrapper whose
// body does what the method's accounting effect, releases and requires
// clauses say, verify mode included (no twin body to drift from it).
func TestCheckedFollowsTheSpec(t *testing.T) {
	s := loadReal(t)
	funcs := checkedFuncs(t, s)
	for _, c := range s.Capabilities {
		recv := "mechanism"
		if !c.Required {
			recv = capType(c)
		}
		for _, m := range c.Methods {
			key := recv + "." + m.Name
			body, ok := funcs[key]
			if !ok {
				t.Errorf("%s.%s: no wrapper method %s", c.Name, m.Name, key)
				continue
			}
			if _, twin := funcs[recv+"."+lowerFirst(m.Name)+"Verified"]; twin {
				t.Errorf("%s.%s: a second, verify-mode body", c.Name, m.Name)
			}
			want := func(where, text, what string) {
				t.Helper()
				if !strings.Contains(where, text) {
					t.Errorf("%s.%s: %s: the wrapper lacks %q", c.Name, m.Name, what, text)
				}
			}
			a := m.Accounting
			if a.Effect != effectQuery {
				want(body, "if m.verify {", "verify mode")
			}
			for _, b := range []string{body} {
				switch a.Effect {
				case effectConsumes:
					want(b, "m.charge(op, "+a.Account+", ", "charge-before-commit")
				case effectRefunds:
					want(b, "m.account(op, "+a.Account+")", "refund account check")
				case effectQuery, effectNone:
					for _, bad := range []string{"charge(", "refund(", "Refund(", "Draw("} {
						if strings.Contains(b, bad) {
							t.Errorf("%s.%s: a %s method must not touch the ledger (%s)", c.Name, m.Name, a.Effect, bad)
						}
					}
				}
				if m.Releases != "" {
					want(b, "memapi.CheckHandle(op, "+m.Releases+", m.info.Instance)", "release-by-creator")
				}
				for _, r := range m.Requires {
					switch r.Pred {
					case predLive:
						want(b, "memapi.CheckHandle(op, "+r.Args[0].Text, r.Text)
					case predWithin:
						want(b, ".Within(", r.Text)
						want(b, `"`+r.Text+`"`, r.Text)
					case predAligned:
						want(b, ".Aligned(m.info.Granularity)", r.Text)
					case predPositive, predFits:
						want(b, `"`+r.Text+`"`, r.Text)
					}
				}
			}
			switch a.Effect {
			case effectConsumes:
				want(body, "m.undraw(", "undraw on failure")
				want(body, "defer m.abandon(", "undraw on a panic")
				want(body, "au.settleDraw(", "verify settles the draw")
			case effectRefunds:
				want(body, "refund(", "refund after success")
				want(body, "au.settleRefund(", "verify settles the refund")
			}
		}
	}
}

// TestCheckedChecksBeforeCharging: in every consuming wrapper the checks come
// before the draw, and the draw before the mechanism's call.
func TestCheckedChecksBeforeCharging(t *testing.T) {
	s := loadReal(t)
	funcs := checkedFuncs(t, s)
	for _, c := range s.Capabilities {
		for _, m := range c.Methods {
			if m.Accounting.Effect != effectConsumes {
				continue
			}
			recv := "mechanism"
			if !c.Required {
				recv = capType(c)
			}
			body := funcs[recv+"."+m.Name]
			charge := strings.Index(body, "m.charge(")
			call := strings.Index(body, "inner."+m.Name+"(")
			lastCheck := max(strings.LastIndex(body, "CheckHandle("), strings.LastIndex(body, "m.err"))
			if charge < 0 || call < 0 || lastCheck > charge || charge > call {
				t.Errorf("%s.%s: want checks (last at %d) < charge (%d) < call (%d)", c.Name, m.Name, lastCheck, charge, call)
			}
		}
	}
}

func TestCheckedRefusesShadowingParams(t *testing.T) {
	s := loadReal(t)
	free := s.Capability("DeviceAllocator").Methods[2]
	if free.Name != "Free" {
		t.Fatalf("spec order changed: %s", free.Name)
	}
	free.Params[1].Name = "m"
	g := newGen(s, Config{Module: realModule})
	err := emitChecked(g)
	if err == nil || !strings.Contains(err.Error(), `parameter name "m" collides`) {
		t.Fatalf("want a collision error, got %v", err)
	}
}

// TestCheckedExamplesNeedTheFakes: the wrapper's examples name the fakes
// they call, and a fakes package that lacks one (as its emitter's result
// says) is an error of the checked emitter naming it, not an example that
// does not compile.
func TestCheckedExamplesNeedTheFakes(t *testing.T) {
	g := newGen(loadReal(t), Config{Module: realModule})
	g.run([]*emitter{fakesEmitter})
	fakes := resultOf[*fakesResult](&generator{current: checkedEmitter, results: g.results}, fakesEmitter)
	if missing := fakes.missing("NewGrant", "Grant.Drawn", fakeMechanism+"."+fakeCallCount("Free"), "Mechanism.Restore"); len(missing) > 0 {
		t.Fatalf("the real fakes lack %v", missing)
	}
	delete(fakes.decls, "NewGrant")
	g.current = checkedEmitter
	err := emitChecked(g)
	if err == nil || !strings.Contains(err.Error(), "use NewGrant, which the fakes (fakes) do not declare") {
		t.Errorf("emitChecked without fakes.NewGrant: %v", err)
	}
}
