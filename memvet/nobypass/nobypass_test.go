package nobypass_test

import (
	"testing"

	"github.com/memgen/memgen/memvet/internal/vettest"
	"github.com/memgen/memgen/memvet/nobypass"
)

func TestCalls(t *testing.T) {
	vettest.Run(t, nobypass.Analyzer, "./memvet/nobypass/testdata/calls")
}

func TestRoles(t *testing.T) {
	vettest.Run(t, nobypass.Analyzer, "./memvet/nobypass/testdata/roles")
}
