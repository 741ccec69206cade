package unsupported_test

import (
	"path/filepath"
	"testing"

	"github.com/memgen/memgen/memvet/unsupported"
	"golang.org/x/tools/go/analysis/analysistest"
)

// The test package lives under testdata inside this module so that it
// imports the real contract; analysistest loads it in module mode.
var root = func() string {
	// Absolute: analysistest hands root's go.work to the go command as
	// GOWORK, which must be an absolute path.
	d, err := filepath.Abs("../..")
	if err != nil {
		panic(err)
	}
	return d
}()

func TestNegotiate(t *testing.T) {
	analysistest.Run(t, root, unsupported.Analyzer, "./memvet/unsupported/testdata/negotiate")
}
