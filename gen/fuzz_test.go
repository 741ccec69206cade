package gen

import (
	"crypto/sha256"
	"errors"
	"go/scanner"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzLoad feeds the loader arbitrary bytes, seeded with every golden case
// (valid and invalid) and the real spec. It must never panic, and every
// failure must be an ErrorList whose entries all carry a position (line and
// column from 1) in the file named at Load.
//
//	go test ./gen -run '^$' -fuzz FuzzLoad -fuzztime 60s -fuzzminimizetime 5s
//
// (A short -fuzzminimizetime keeps the fuzzer from spending its time
// minimizing spec-sized inputs.)
func FuzzLoad(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*/spec.yaml")
	seeds = append(seeds, realSpec)
	for _, p := range seeds {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(""))
	f.Add([]byte("version: 1\n"))
	f.Add([]byte("&a [*a]"))
	f.Add([]byte("types: {A: {kind: handle, doc: x, fields: {B: A}}}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Load(specName, data)
		if err == nil {
			if s == nil {
				t.Fatal("nil spec without an error")
			}
			return
		}
		if s != nil {
			t.Fatalf("spec returned with an error: %v", err)
		}
		var list ErrorList
		if !errors.As(err, &list) {
			t.Fatalf("error is %T, not ErrorList: %v", err, err)
		}
		if len(list) == 0 {
			t.Fatal("empty ErrorList")
		}
		for _, e := range list {
			if e == nil {
				t.Fatal("nil entry in ErrorList")
			}
			if e.Pos.File != specName || e.Pos.Line <= 0 || e.Pos.Col <= 0 || e.Msg == "" {
				t.Fatalf("error without a position or message: %q (pos %+v)", e.Error(), e.Pos)
			}
		}
	})
}

// FuzzGenerate mutates valid specs and holds the generator to what the
// loader promises: every spec it accepts generates without error, every file
// carries memgen's header, and the Go files type-check (go/types over the
// generated packages, importing one another and the standard library, with
// stand-ins for the hand-written mechanisms).
//
//	go test ./gen -run '^$' -fuzz '^FuzzGenerate$' -fuzztime 60s -fuzzminimizetime 5s
//
// `make fuzz-ci` runs it, and FuzzLoad, for a bounded time in CI.
func FuzzGenerate(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*/expected")
	for i := range seeds {
		seeds[i] = filepath.Join(filepath.Dir(seeds[i]), "spec.yaml")
	}
	seeds = append(seeds, realSpec)
	for _, p := range seeds {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	// Most mutants the loader accepts differ from one already checked only
	// in prose (doc comments, the spec text in Meta), which cannot change a
	// type: the code's shape is checked once per worker.
	checked := map[[32]byte]bool{}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Load(specName, data)
		if err != nil {
			return
		}
		files, err := Generate(s, Config{Module: goldenModule})
		if err != nil {
			t.Fatalf("the loader accepted the spec, but generation failed:\n%v", err)
		}
		for rel, b := range files {
			if !HasHeader(b) {
				t.Fatalf("%s lacks the header", rel)
			}
		}
		key := codeShape(files)
		if checked[key] {
			return
		}
		if err := typeCheck(s, goldenModule, files); err != nil {
			t.Fatalf("the loader accepted the spec, but the generated code does not type-check:\n%v", err)
		}
		checked[key] = true
	})
}

// codeShape hashes the Go files of a generation without their comments and
// with every string literal emptied: two generations with the same shape
// type-check alike.
func codeShape(files map[string][]byte) [32]byte {
	h := sha256.New()
	fset := token.NewFileSet()
	for _, rel := range sortedKeys(files) {
		if !strings.HasSuffix(rel, ".go") {
			continue
		}
		h.Write([]byte(rel + "\n"))
		var sc scanner.Scanner
		src := files[rel]
		sc.Init(fset.AddFile(rel, -1, len(src)), src, nil, 0)
		for {
			_, tok, lit := sc.Scan()
			if tok == token.EOF {
				break
			}
			if tok == token.STRING {
				lit = `""`
			}
			h.Write([]byte(tok.String() + " " + lit + "\n"))
		}
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}
