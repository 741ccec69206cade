package recorduse_test

import (
	"testing"

	"github.com/memgen/memgen/memvet/internal/vettest"
	"github.com/memgen/memgen/memvet/recorduse"
)

func TestWork(t *testing.T) {
	vettest.Run(t, recorduse.Analyzer, "./memvet/recorduse/testdata/work")
}
