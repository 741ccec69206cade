package gen

import (
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ownership is the spec's ownership section: who outside the contract may
// implement the ledger roles, and which handles of the layers above own
// memory until disposed of. The generator cannot see those packages; it
// passes the section on as data (memapi.Vet) for cmd/memvet.
type ownership struct {
	Ledgers    []string // module-relative package directories
	LedgerPos  []pos
	Handles    []*owningHandle
	HasSection bool
	Pos        pos
}

// owningHandle is a type that owns memory (or a reference to it) until its
// Close method runs.
type owningHandle struct {
	Package, Type, Close string
	Pos                  pos
}

var pkgDirRE = regexp.MustCompile(`^[a-z0-9_][a-z0-9_./-]*$`)

func (l *loader) ownership(n *yaml.Node) {
	o := &l.s.Ownership
	o.HasSection, o.Pos = true, l.pos(n)
	for _, p := range l.mapping(n, "ownership", specKeys["ownership"]...) {
		switch p.k.Value {
		case "ledgers":
			o.Ledgers, o.LedgerPos = l.strList(p.v, "ownership.ledgers")
			for i, d := range o.Ledgers {
				if !pkgDirRE.MatchString(d) || strings.Contains(d, "..") || strings.HasSuffix(d, "/") {
					l.e.add(o.LedgerPos[i], "ownership.ledgers: %q is not a module-relative package directory", d)
				}
			}
		case "handles":
			for _, h := range l.mapping(p.v, "ownership.handles") {
				what := "ownership.handles." + h.k.Value
				i := strings.LastIndex(h.k.Value, ".")
				if i <= 0 || !pkgDirRE.MatchString(h.k.Value[:i]) || strings.Contains(h.k.Value[:i], "..") || !identRE.MatchString(h.k.Value[i+1:]) {
					l.e.add(l.pos(h.k), "%s: want package.Type, such as pmm.Buffer", what)
					continue
				}
				cl := l.str(h.v, what)
				if cl != "" && !identRE.MatchString(cl) {
					l.e.add(l.pos(h.v), "%s: %q is not an exported method name", what, cl)
				}
				o.Handles = append(o.Handles, &owningHandle{Package: h.k.Value[:i], Type: h.k.Value[i+1:], Close: cl, Pos: l.pos(h.k)})
			}
		}
	}
}
