package handleclose_test

import (
	"testing"

	"github.com/memgen/memgen/memvet/handleclose"
	"github.com/memgen/memgen/memvet/internal/vettest"
)

func TestLeaks(t *testing.T) {
	vettest.Run(t, handleclose.Analyzer, "./memvet/handleclose/testdata/leaks")
}

func TestSuggestedFix(t *testing.T) {
	vettest.RunWithSuggestedFixes(t, handleclose.Analyzer, "./memvet/handleclose/testdata/fix")
}
