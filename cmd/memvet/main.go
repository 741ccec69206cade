// Command memvet checks memgen's invariants at compile time: it runs the
// analyzers of package memvet (nobypass, handleclose, unsupported, and the
// check of the //memvet:allow escape) over Go packages. Run it standalone,
//
//	go run github.com/memgen/memgen/cmd/memvet ./...
//
// or as a vet tool, beside go vet's own checks' driver:
//
//	go install github.com/memgen/memgen/cmd/memvet
//	go vet -vettool=$(command -v memvet) ./...
//
// It exits 0 when nothing is found, 3 with findings, 1 on a load error. The
// lists it checks against (consuming and refunding methods, ledger packages,
// owning handles) come from spec/capabilities.yaml through memapi.Meta and
// memapi.Vet. See docs/memvet.md.
package main

import (
	"github.com/memgen/memgen/memvet"
	"golang.org/x/tools/go/analysis/multichecker"
)

func main() { multichecker.Main(memvet.Analyzers()...) }
