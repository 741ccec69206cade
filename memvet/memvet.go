// Package memvet gathers memgen's static checks of the spec's invariants,
// each a golang.org/x/tools/go/analysis Analyzer in its own package, for
// cmd/memvet (a multichecker) and for anyone who wants to run them from
// another driver. docs/memvet.md says what each checks, why, and its limits.
package memvet

import (
	"github.com/memgen/memgen/memvet/allow"
	"github.com/memgen/memgen/memvet/handleclose"
	"github.com/memgen/memgen/memvet/nobypass"
	"github.com/memgen/memgen/memvet/recorduse"
	"github.com/memgen/memgen/memvet/unsupported"
	"golang.org/x/tools/go/analysis"
)

// Analyzers returns memvet's analyzers in the order cmd/memvet runs them.
func Analyzers() []*analysis.Analyzer {
	return []*analysis.Analyzer{
		nobypass.Analyzer,
		handleclose.Analyzer,
		unsupported.Analyzer,
		recorduse.Analyzer,
		allow.Analyzer,
	}
}
