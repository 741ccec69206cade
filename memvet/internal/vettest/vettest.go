// Package vettest runs memvet's analyzers over their test packages. Those
// live under testdata inside the core module, so that they import the real
// contract, pmm, fakes and checked wrapper; analysistest loads them in
// module mode from the module's root.
package vettest

import (
	"path/filepath"
	"testing"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/analysistest"
)

// root is the core module's root, two levels above an analyzer's package
// (memvet/NAME, where its tests run). Absolute: analysistest hands root's
// go.work to the go command as GOWORK, which must be an absolute path.
func root(t *testing.T) string {
	t.Helper()
	d, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Run is analysistest.Run of a over pkgs, patterns relative to the module's
// root ("./memvet/NAME/testdata/...").
func Run(t *testing.T, a *analysis.Analyzer, pkgs ...string) {
	t.Helper()
	analysistest.Run(t, root(t), a, pkgs...)
}

// RunWithSuggestedFixes is analysistest.RunWithSuggestedFixes of a over
// pkgs, as Run.
func RunWithSuggestedFixes(t *testing.T, a *analysis.Analyzer, pkgs ...string) {
	t.Helper()
	analysistest.RunWithSuggestedFixes(t, root(t), a, pkgs...)
}
