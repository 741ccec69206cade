package main

import (
	"fmt"
	"io"

	"github.com/memgen/memgen/gen"
)

// noteUnwritten tells the user, after generate, which declared mechanisms
// have only their generated glue so far: their packages compile once the
// hand-written type exists, and the compiler then lists what it lacks.
func noteUnwritten(p *project, stderr io.Writer) {
	for _, m := range p.spec.Mechanisms {
		if !m.PackageWritten(p.root) {
			fmt.Fprintf(stderr, "memgen generate: mechanism %s: wrote %s/%s; write type %s in package %s there (README, \"Adding a mechanism\"): until then the package does not compile\n",
				m.Name, m.Package, gen.GlueFile, m.Type, m.Package)
		}
	}
}
