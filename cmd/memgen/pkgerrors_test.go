package main

import (
	"reflect"
	"testing"

	"golang.org/x/tools/go/packages"
)

// TestPackageErrorsOnce: a package that does not compile is reported once
// per error, with its position relative to the module root, without the go
// command's unpositioned copy of the same output.
func TestPackageErrorsOnce(t *testing.T) {
	pkg := &packages.Package{PkgPath: "example.com/m/mechanisms/x", Errors: []packages.Error{
		{Pos: "-", Msg: "# example.com/m/mechanisms/x\nmechanisms/x/a.go:3:1: undefined: y", Kind: packages.ListError},
		{Pos: "/root/mechanisms/x/a.go:3:1", Msg: "undefined: y", Kind: packages.TypeError},
		{Pos: "/root/mechanisms/x/a.go:3:1", Msg: "undefined: y", Kind: packages.TypeError},
		{Pos: "/root/mechanisms/x/b.go:9:2", Msg: "missing return", Kind: packages.TypeError},
	}}
	want := []string{"mechanisms/x/a.go:3:1: undefined: y", "mechanisms/x/b.go:9:2: missing return"}
	if got := packageErrors(pkg, "/root"); !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	// With no positioned error the unpositioned one is all there is.
	pkg.Errors = pkg.Errors[:1]
	if got := packageErrors(pkg, "/root"); len(got) != 1 || got[0] != pkg.PkgPath+": "+pkg.Errors[0].Msg {
		t.Errorf("got %q, want the one unpositioned error", got)
	}
}
