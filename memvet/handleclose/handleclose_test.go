package handleclose_test

import (
	"path/filepath"
	"testing"

	"github.com/memgen/memgen/memvet/handleclose"
	"golang.org/x/tools/go/analysis/analysistest"
)

// The test packages live under testdata inside this module so that they
// import the real pmm; analysistest loads them in module mode.
var root = func() string {
	// Absolute: analysistest hands root's go.work to the go command as
	// GOWORK, which must be an absolute path.
	d, err := filepath.Abs("../..")
	if err != nil {
		panic(err)
	}
	return d
}()

func TestLeaks(t *testing.T) {
	analysistest.Run(t, root, handleclose.Analyzer, "./memvet/handleclose/testdata/leaks")
}

func TestSuggestedFix(t *testing.T) {
	analysistest.RunWithSuggestedFixes(t, root, handleclose.Analyzer, "./memvet/handleclose/testdata/fix")
}
