package handleclose_test

import (
	"testing"

	"github.com/memgen/memgen/memvet/handleclose"
	"golang.org/x/tools/go/analysis/analysistest"
)

// The test packages live under testdata inside this module so that they
// import the real pmm; analysistest loads them in module mode.
const root = "../.."

func TestLeaks(t *testing.T) {
	analysistest.Run(t, root, handleclose.Analyzer, "./memvet/handleclose/testdata/leaks")
}

func TestSuggestedFix(t *testing.T) {
	analysistest.RunWithSuggestedFixes(t, root, handleclose.Analyzer, "./memvet/handleclose/testdata/fix")
}
