package gen

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	. "github.com/dave/jennifer/jen"
)

func loadTiny(t *testing.T) *Spec {
	t.Helper()
	data, err := os.ReadFile("testdata/valid_tiny/spec.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Load(specName, data)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestGenerateCollectsEmitterErrors: every emitter runs even when another
// fails (unless it requires the one that failed), and every error it records
// or returns comes back in one ErrorList at a spec position (a message that
// starts with one keeps it).
func TestGenerateCollectsEmitterErrors(t *testing.T) {
	s := loadTiny(t)
	alloc := s.Capability("DeviceAllocator").Methods[1].Pos
	saved := emitters
	defer func() { emitters = saved }()
	emitters = append(append([]*emitter(nil), saved...),
		&emitter{Name: "first", Emit: noResult(func(g *generator) error {
			return fmt.Errorf("%s: returned with a position", alloc)
		})},
		&emitter{Name: "second", Emit: noResult(func(g *generator) error {
			g.Errorf(s.Types[0].Pos, "recorded one")
			g.Errorf(s.Types[1].Pos, "recorded two")
			return errors.New("returned without a position")
		})},
	)
	_, err := Generate(s, Config{Module: goldenModule})
	var list ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("Generate returned %T (%v), want an ErrorList", err, err)
	}
	want := []string{
		"spec/capabilities.yaml:1:1: second: returned without a position",
		s.Types[0].Pos.String() + ": recorded one",
		s.Types[1].Pos.String() + ": recorded two",
		alloc.String() + ": first: returned with a position",
	}
	if got := strings.Split(list.Error(), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("errors:\n%s\nwant:\n%s", list.Error(), strings.Join(want, "\n"))
	}
}

// TestGenerateFormatErrorIsBrief: generated code that does not parse is
// reported at the spec declaration its line names, with the generated
// position and a few lines around it, never as a dump of the source.
func TestGenerateFormatErrorIsBrief(t *testing.T) {
	s := loadTiny(t)
	g := newGen(s, Config{Module: goldenModule})
	f := g.File("x/bad.go", "")
	for i := 0; i < 200; i++ {
		f.Func().Id(fmt.Sprintf("filler%d", i)).Params().Block()
	}
	f.Func().Id("Allocate").Params(Id("range").Int()).Block()
	g.render()
	if len(g.errs.list) != 1 {
		t.Fatalf("got %d errors, want 1: %v", len(g.errs.list), g.errs.list)
	}
	e := g.errs.list[0]
	if want := s.Capability("DeviceAllocator").Methods[1].Pos; e.Pos != want {
		t.Errorf("reported at %s, want %s (the method the line names)", e.Pos, want)
	}
	for _, w := range []string{"generated x/bad.go:", "does not compile", "> ", "range int"} {
		if !strings.Contains(e.Msg, w) {
			t.Errorf("message lacks %q:\n%s", w, e.Msg)
		}
	}
	if len(e.Msg) > 1000 || strings.Count(e.Msg, "\n") > 6 {
		t.Errorf("message is %d bytes, %d lines; want a short excerpt:\n%s", len(e.Msg), strings.Count(e.Msg, "\n"), e.Msg)
	}
}
