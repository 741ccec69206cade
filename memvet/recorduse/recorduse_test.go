package recorduse_test

import (
	"testing"

	"github.com/memgen/memgen/memvet/recorduse"
	"golang.org/x/tools/go/analysis/analysistest"
)

// The test package lives under testdata inside this module so that it
// imports the real pmm; analysistest loads it in module mode.
const root = "../.."

func TestWork(t *testing.T) {
	analysistest.Run(t, root, recorduse.Analyzer, "./memvet/recorduse/testdata/work")
}
