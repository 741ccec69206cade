package recorduse_test

import (
	"path/filepath"
	"testing"

	"github.com/memgen/memgen/memvet/recorduse"
	"golang.org/x/tools/go/analysis/analysistest"
)

// The test package lives under testdata inside this module so that it
// imports the real pmm; analysistest loads it in module mode.
var root = func() string {
	// Absolute: analysistest hands root's go.work to the go command as
	// GOWORK, which must be an absolute path.
	d, err := filepath.Abs("../..")
	if err != nil {
		panic(err)
	}
	return d
}()

func TestWork(t *testing.T) {
	analysistest.Run(t, root, recorduse.Analyzer, "./memvet/recorduse/testdata/work")
}
