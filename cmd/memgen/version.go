package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// version describes this memgen binary from the build information the Go
// command records in it: the module and its version ("(devel)" for a build
// from a checkout without version stamping), the VCS revision, its time and
// whether the tree was modified, and the Go version and platform.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return fmt.Sprintf("memgen: no build information (%s %s/%s)", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "memgen %s %s", bi.Main.Path, bi.Main.Version)
	var rev, at, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = ", modified"
			}
		}
	}
	if rev != "" {
		fmt.Fprintf(&b, " (revision %s", rev)
		if at != "" {
			fmt.Fprintf(&b, " of %s", at)
		}
		b.WriteString(dirty + ")")
	}
	fmt.Fprintf(&b, ", %s %s/%s", bi.GoVersion, runtime.GOOS, runtime.GOARCH)
	return b.String()
}
