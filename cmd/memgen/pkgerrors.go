package main

import (
	"path/filepath"
	"strings"

	"golang.org/x/tools/go/packages"
)

// packageErrors returns the errors of a loaded package once each, as
// "file:line:col: message" with the file relative to root. go/packages
// reports a package that does not compile twice: the go command's build
// output as one error with no position ("-"), then each type error with its
// position. When positioned errors exist the unpositioned ones repeat them
// and are dropped.
func packageErrors(pkg *packages.Package, root string) []string {
	positioned := false
	for _, e := range pkg.Errors {
		if e.Pos != "" && e.Pos != "-" {
			positioned = true
		}
	}
	seen := map[string]bool{}
	var out []string
	for _, e := range pkg.Errors {
		var line string
		switch {
		case e.Pos != "" && e.Pos != "-":
			pos := e.Pos
			if rel, err := filepath.Rel(root, pos); err == nil && !strings.HasPrefix(rel, "..") {
				pos = filepath.ToSlash(rel)
			}
			line = pos + ": " + e.Msg
		case positioned:
			continue
		default:
			line = pkg.PkgPath + ": " + e.Msg
		}
		if !seen[line] {
			seen[line] = true
			out = append(out, line)
		}
	}
	return out
}
