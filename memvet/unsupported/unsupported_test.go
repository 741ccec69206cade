package unsupported_test

import (
	"testing"

	"github.com/memgen/memgen/memvet/internal/vettest"
	"github.com/memgen/memgen/memvet/unsupported"
)

func TestNegotiate(t *testing.T) {
	vettest.Run(t, unsupported.Analyzer, "./memvet/unsupported/testdata/negotiate")
}
