package nobypass_test

import (
	"path/filepath"
	"testing"

	"github.com/memgen/memgen/memvet/nobypass"
	"golang.org/x/tools/go/analysis/analysistest"
)

// The test packages live under testdata inside this module, so that they
// import the real contract, fakes and checked wrapper; analysistest loads
// them in module mode from the module root.
var root = func() string {
	// Absolute: analysistest hands root's go.work to the go command as
	// GOWORK, which must be an absolute path.
	d, err := filepath.Abs("../..")
	if err != nil {
		panic(err)
	}
	return d
}()

func TestCalls(t *testing.T) {
	analysistest.Run(t, root, nobypass.Analyzer, "./memvet/nobypass/testdata/calls")
}

func TestRoles(t *testing.T) {
	analysistest.Run(t, root, nobypass.Analyzer, "./memvet/nobypass/testdata/roles")
}
