package allow_test

import (
	"testing"

	"github.com/memgen/memgen/memvet/allow"
	"golang.org/x/tools/go/analysis/analysistest"
)

func TestAllow(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), allow.Analyzer, "a")
}
