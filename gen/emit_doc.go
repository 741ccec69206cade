package gen

import (
	"fmt"
	"regexp"
	"strings"
)

// DocFile is the module-relative path of the generated capability reference.
const DocFile = "docs/capabilities.md"

// docEmitter writes DocFile, from the spec alone.
var docEmitter = &emitter{Name: docEmitterName, Emit: noResult(emitDoc)}

// docEmitterName is docEmitter's name, which CapabilitiesDoc's header
// names (a constant: the emitter's Emit reaches CapabilitiesDoc).
const docEmitterName = "doc"

func init() { register(docEmitter) }

// emitDoc adds docs/capabilities.md to every run, so that `memgen check`
// catches a reference that is older than the spec like any other file.
func emitDoc(g *generator) error {
	g.Raw(DocFile, CapabilitiesDoc(g.Spec, g.Config))
	return nil
}

// CapabilitiesDoc renders the spec as Markdown: the capability matrix of the
// mechanisms, every method with its accounting effect and preconditions, the
// ledger and device-context interfaces, the invariant table, and Mermaid
// diagrams of who offers what and how bytes move through the ledger. The
// output depends on the spec alone (and, in its header, on cfg's spec path)
// and is deterministic.
func CapabilitiesDoc(s *Spec, cfg Config) []byte {
	w := &mdWriter{}
	w.line(markdownHeader(cfg.specPath(s), docEmitterName))
	w.line("")
	w.line("# Capabilities")
	w.line("")
	w.linef("This reference is generated from `%s` (sha256 `%s`) by `memgen doc`", s.File, short(s.Digest))
	w.line("(and by `go generate ./...`). Edit the spec, never this file; `memgen check`")
	w.line("fails when the two disagree.")
	w.line("")
	w.line("- [Capability matrix](#capability-matrix)")
	w.line("- [Methods and their accounting](#methods-and-their-accounting)")
	w.line("- [Ledger and device-context interfaces](#ledger-and-device-context-interfaces)")
	w.line("- [Invariants](#invariants)")
	w.line("- [Diagrams](#diagrams)")
	w.line("")

	docMatrix(w, s)
	docMethods(w, s)
	docInterfaces(w, s)
	docInvariants(w, s)
	docDiagrams(w, s)
	return []byte(strings.TrimRight(w.b.String(), "\n") + "\n")
}

func docMatrix(w *mdWriter, s *Spec) {
	w.line("## Capability matrix")
	w.line("")
	w.line("Which capability each mechanism declares. A mechanism reaches an optional")
	w.line("capability only through its accessor (`Mechanism.AsX`), which also reports")
	w.line("absence when the device lacks the feature at run time.")
	w.line("")
	head := []string{"mechanism", "device", "granularity", "package"}
	for _, c := range s.Capabilities {
		name := c.Name
		if c.Required {
			name += " (required)"
		}
		head = append(head, name)
	}
	w.row(head...)
	w.sep(len(head))
	for _, m := range s.Mechanisms {
		offered := map[string]bool{}
		for _, o := range m.Offers {
			offered[o] = true
		}
		cells := []string{"`" + m.Name + "`", m.Device, m.Granularity, "`" + m.Package + "`"}
		for _, c := range s.Capabilities {
			if offered[c.Name] {
				cells = append(cells, "yes")
			} else {
				cells = append(cells, "—")
			}
		}
		w.row(cells...)
	}
	w.line("")
	for _, m := range s.Mechanisms {
		if m.Doc != "" {
			w.linef("- `%s` (type `%s`): %s", m.Name, m.Type, oneLine(m.Doc))
		}
	}
	w.line("")
}

func docMethods(w *mdWriter, s *Spec) {
	w.line("## Methods and their accounting")
	w.line("")
	w.line("The checked wrapper moves the ledger from these effects: before a consuming")
	w.line("call it draws the rounded amount from the grant (and undraws it if the call")
	w.line("fails); after a successful refunding call it refunds the amount to the")
	w.line("account. Mechanisms never draw or refund themselves.")
	w.line("")
	for _, c := range s.Capabilities {
		kind := "optional"
		if c.Required {
			kind = "required"
		}
		w.linef("### %s (%s)", c.Name, kind)
		w.line("")
		w.line(oneLine(c.Doc))
		w.line("")
		w.row("method", "signature", "accounting", "handles", "requires")
		w.sep(5)
		for _, m := range c.Methods {
			var handles []string
			if m.Creates != "" {
				handles = append(handles, "creates "+m.Creates)
			}
			if m.Releases != "" {
				handles = append(handles, "releases `"+m.Releases+"`")
			}
			var req []string
			for _, r := range m.Requires {
				req = append(req, "`"+r.Text+"`")
			}
			w.row(m.Name, "`"+signature(s, m)+"`", effect(m.Accounting), join(handles, "; "), join(req, ", "))
		}
		w.line("")
		for _, m := range c.Methods {
			if m.Doc != "" {
				w.linef("- **%s**: %s", m.Name, oneLine(m.Doc))
			}
		}
		w.line("")
	}
}

func docInterfaces(w *mdWriter, s *Spec) {
	w.line("## Ledger and device-context interfaces")
	w.line("")
	w.line("Consuming methods draw from the `grant` role, refunding methods pay into the")
	w.line("`account` role; the device-context roles order releases behind fences.")
	w.line("")
	w.row("interface", "role", "methods", "what it is")
	w.sep(4)
	for _, i := range s.Interfaces {
		var ms []string
		for _, m := range i.Methods {
			ms = append(ms, "`"+signature(s, m)+"`")
		}
		role := i.Role
		if role == "" {
			role = "—"
		}
		w.row(i.Name, role, join(ms, "<br>"), oneLine(i.Doc))
	}
	w.line("")
}

func docInvariants(w *mdWriter, s *Spec) {
	w.line("## Invariants")
	w.line("")
	w.row("id", "invariant", "enforced by", "applies to")
	w.sep(4)
	for _, iv := range s.Invariants {
		var enf []string
		for _, e := range iv.EnforcedBy {
			enf = append(enf, "`"+e+"`")
		}
		w.row("`"+iv.ID+"`", oneLine(iv.Says), join(enf, ", "), appliesTo(s, iv.Applies))
	}
	w.line("")
}

// appliesTo names what an invariant governs, expanding "every consuming
// method" into the methods themselves so that the table is checkable.
func appliesTo(s *Spec, a applies) string {
	var parts []string
	methods := func(effect string, release bool) string {
		var ms []string
		for _, c := range s.Capabilities {
			for _, m := range c.Methods {
				if (!release && m.Accounting.Effect == effect) || (release && m.Releases != "") {
					ms = append(ms, c.Name+"."+m.Name)
				}
			}
		}
		return join(ms, ", ")
	}
	if a.Consumes {
		parts = append(parts, "every consuming method ("+methods(effectConsumes, false)+")")
	}
	if a.Releases {
		parts = append(parts, "every releasing method ("+methods("", true)+")")
	}
	if len(a.Capabilities) > 0 {
		parts = append(parts, "capabilities "+strings.Join(a.Capabilities, ", "))
	}
	if len(a.Interfaces) > 0 {
		parts = append(parts, "interfaces "+strings.Join(a.Interfaces, ", "))
	}
	return strings.Join(parts, "; ")
}

func docDiagrams(w *mdWriter, s *Spec) {
	w.line("## Diagrams")
	w.line("")
	w.line("Who offers what (dashed: optional capability):")
	w.line("")
	w.line("```mermaid")
	w.line("flowchart LR")
	for _, m := range s.Mechanisms {
		w.linef("  %s[%s]", mermaidID("mech", m.Name), mermaidLabel(m.Name+" ("+m.Device+")"))
	}
	for _, c := range s.Capabilities {
		label := c.Name
		if c.Required {
			label += " (required)"
		}
		w.linef("  %s{{%s}}", mermaidID("cap", c.Name), mermaidLabel(label))
	}
	for _, m := range s.Mechanisms {
		for _, o := range m.Offers {
			arrow := "-.->"
			if c := s.Capability(o); c != nil && c.Required {
				arrow = "-->"
			}
			w.linef("  %s %s %s", mermaidID("mech", m.Name), arrow, mermaidID("cap", o))
		}
	}
	w.line("```")
	w.line("")
	w.line("How bytes and handles move: consuming methods draw from the grant and")
	w.line("create handles; releasing methods end handles and refund to the account.")
	w.line("")
	w.line("```mermaid")
	w.line("flowchart LR")
	grant, account := s.roleInterface(roleGrant), s.roleInterface(roleAccount)
	grantName, accountName := "Grant", "Account"
	if grant != nil {
		grantName = grant.Name
	}
	if account != nil {
		accountName = account.Name
	}
	w.linef("  %s[(%s)]", mermaidID("ifc", grantName), mermaidLabel(grantName))
	w.linef("  %s[(%s)]", mermaidID("ifc", accountName), mermaidLabel(accountName))
	for _, h := range s.handles() {
		w.linef("  %s([%s])", mermaidID("handle", h.Name), mermaidLabel(h.Name))
	}
	for _, c := range s.Capabilities {
		for _, m := range c.Methods {
			a := m.Accounting
			switch {
			case m.Creates != "" && a.Effect == effectConsumes:
				w.linef("  %s -->|%s| %s", mermaidID("ifc", grantName), mermaidLabel(m.Name+": "+a.Amount.Text+" ("+a.Round+")"), mermaidID("handle", m.Creates))
			case m.Creates != "":
				w.linef("  %s -.->|%s| %s", mermaidID("cap", c.Name), mermaidLabel(m.Name), mermaidID("handle", m.Creates))
			case a.Effect == effectConsumes:
				// Consumes without creating (Commit): the bytes back a handle
				// named by a parameter.
				if h := firstHandleParam(s, m); h != "" {
					w.linef("  %s -->|%s| %s", mermaidID("ifc", grantName), mermaidLabel(m.Name+": "+a.Amount.Text+" ("+a.Round+")"), mermaidID("handle", h))
				}
			}
			if m.Releases != "" || a.Effect == effectRefunds {
				from := ""
				if m.Releases != "" {
					if p := m.Param(m.Releases); p != nil {
						from = p.Type
					}
				} else {
					from = firstHandleParam(s, m)
				}
				if from == "" {
					continue
				}
				if a.Effect == effectRefunds {
					w.linef("  %s -->|%s| %s", mermaidID("handle", from), mermaidLabel(m.Name+": "+a.Amount.Text), mermaidID("ifc", accountName))
				} else {
					w.linef("  %s -.->|%s| %s", mermaidID("handle", from), mermaidLabel(m.Name), mermaidID("cap", c.Name))
				}
			}
		}
	}
	for _, c := range s.Capabilities {
		w.linef("  %s{{%s}}", mermaidID("cap", c.Name), mermaidLabel(c.Name))
	}
	w.line("```")
}

func firstHandleParam(s *Spec, m *method) string {
	for _, p := range m.Params {
		if t := s.Type(p.Type); t != nil && t.Kind == KindHandle {
			return p.Type
		}
	}
	return ""
}

// signature renders a method as Go: handles are pointers.
func signature(s *Spec, m *method) string {
	goType := func(n string) string {
		if t := s.Type(n); t != nil && t.Kind == KindHandle {
			return "*" + n
		}
		return n
	}
	var ps, rs []string
	for _, p := range m.Params {
		ps = append(ps, p.Name+" "+goType(p.Type))
	}
	for _, r := range m.Returns {
		rs = append(rs, goType(r.Type))
	}
	out := m.Name + "(" + strings.Join(ps, ", ") + ")"
	switch len(rs) {
	case 0:
	case 1:
		out += " " + rs[0]
	default:
		out += " (" + strings.Join(rs, ", ") + ")"
	}
	return out
}

// effect says in words what a method does to the ledger.
func effect(a accounting) string {
	round := func() string {
		switch a.Round {
		case roundAlloc:
			return " rounded up to the allocation granularity"
		case roundGranularity:
			return " rounded up to the granularity"
		}
		return ""
	}
	switch a.Effect {
	case effectConsumes:
		return fmt.Sprintf("consumes `%s`%s, drawn from `%s`", a.Amount.Text, round(), a.Account)
	case effectRefunds:
		return fmt.Sprintf("refunds `%s`%s to `%s`", a.Amount.Text, round(), a.Account)
	case effectQuery:
		return "query only"
	}
	return "none"
}

type mdWriter struct{ b strings.Builder }

func (w *mdWriter) line(s string) { w.b.WriteString(s); w.b.WriteByte('\n') }

func (w *mdWriter) linef(format string, args ...any) { w.line(fmt.Sprintf(format, args...)) }

// row writes a table row; cells are escaped so that a pipe in the spec's text
// cannot break the table.
func (w *mdWriter) row(cells ...string) {
	for i, c := range cells {
		cells[i] = strings.ReplaceAll(c, "|", `\|`)
		if cells[i] == "" {
			cells[i] = "—"
		}
	}
	w.line("| " + strings.Join(cells, " | ") + " |")
}

func (w *mdWriter) sep(n int) {
	w.line("|" + strings.Repeat(" --- |", n))
}

var spaces = regexp.MustCompile(`\s+`)

// oneLine folds a multi-line spec text into one Markdown line.
func oneLine(s string) string { return strings.TrimSpace(spaces.ReplaceAllString(s, " ")) }

func join(xs []string, sep string) string { return strings.Join(xs, sep) }

func short(digest string) string {
	if len(digest) > 12 {
		return digest[:12]
	}
	return digest
}

var mermaidUnsafe = regexp.MustCompile(`[^A-Za-z0-9_]`)

// mermaidID makes a node id that cannot clash across kinds or break the
// diagram's syntax.
func mermaidID(kind, name string) string {
	return kind + "_" + mermaidUnsafe.ReplaceAllString(name, "_")
}

// mermaidLabel quotes a label; Mermaid has no escape for a double quote but
// its entity.
func mermaidLabel(s string) string {
	return `"` + strings.ReplaceAll(oneLine(s), `"`, "#quot;") + `"`
}
