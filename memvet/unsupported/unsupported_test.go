package unsupported_test

import (
	"testing"

	"github.com/memgen/memgen/memvet/unsupported"
	"golang.org/x/tools/go/analysis/analysistest"
)

// The test package lives under testdata inside this module so that it
// imports the real contract; analysistest loads it in module mode.
const root = "../.."

func TestNegotiate(t *testing.T) {
	analysistest.Run(t, root, unsupported.Analyzer, "./memvet/unsupported/testdata/negotiate")
}
