// Command memgen generates memgen's contract, checked wrappers, fakes and
// conformance suite from spec/capabilities.yaml, and checks that the tree
// matches the spec.
//
//	memgen generate   write every generated file (what go generate ./... runs)
//	memgen check      validate the spec, fail on drift (printing a unified
//	                  diff of the first drifting file) and on mechanisms that
//	                  do not implement exactly what the spec declares
//	memgen doc        write docs/capabilities.md from the spec
//	memgen version    the module version, VCS revision and Go version this
//	                  binary was built with (runtime/debug build information)
//	memgen help [cmd] the commands, or one command's flags
//
// Exit codes, the same in memctl and memdemo: 0 done, 1 a spec, drift or
// check error (a failed plugin-check too), 2 a usage error, 3 refused
// (memgen new: the name or the directory is taken; nothing written).
package main

import (
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
