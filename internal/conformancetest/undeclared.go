package conformancetest

import "github.com/memgen/memgen/generated/memapi"

// Undeclared returns m behind a type of this package, which the spec does not
// declare, so that the suite's spec/... subtests find no declaration by the
// mechanism's package and look m up by Info().Mechanism alone (skipping when
// the spec has no mechanism of that name), as for any test mechanism. The
// meta-tests of mechanisms/example, a package the spec declares, present its
// mechanism this way under other names ("mem", "cpu", "cuda") and in shapes
// its declaration does not have. Every call goes to m.
func Undeclared(m memapi.Mechanism) memapi.Mechanism { return undeclared{m} }

// undeclared is a mechanism of no package the spec declares.
type undeclared struct{ memapi.Mechanism }
