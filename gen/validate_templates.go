package gen

import (
	"io/fs"
	"path"
	"slices"
	"sort"
	"strings"
)

// validateTemplateNeeds holds a spec to what the hand-written templates need
// of it, so that every spec the loader accepts generates. A template's
// "memgen:needs" line leaves the file out when a name is missing, which is
// right for a capability the spec does not declare (no VirtualBacking, no
// VirtualBacking conformance) but wrong for a missing method, type or error
// of a capability it does declare: the file would silently drop out, and
// with it fixtures the rest of the suite calls. So a template applies when
// every capability its needs name (VirtualBacking, or VirtualBacking.Commit)
// is declared, and then each of its needs must be.
func validateTemplateNeeds(s *Spec, e *errs) {
	if !s.sectionOK("types") || !s.sectionOK("errors") || !s.sectionOK("capabilities") {
		return // reported already; the needs would only repeat it
	}
	declared := s.declaredNames()
	needs := templateNeeds()
	// The templates are written for memgen's own spec: the capabilities they
	// know are the ones whose methods they name.
	known := map[string]bool{}
	for _, t := range needs {
		for _, n := range t.needs {
			if c, _, ok := strings.Cut(n, "."); ok {
				known[c] = true
			}
		}
	}
	type miss struct{ capability, name string }
	users := map[miss][]string{}
	for _, t := range needs {
		applies, capability := true, ""
		for _, n := range t.needs {
			c, _, _ := strings.Cut(n, ".")
			if !known[c] {
				continue
			}
			if s.caps[c] == nil {
				applies = false
			}
			if capability == "" {
				capability = c
			}
		}
		if !applies {
			continue
		}
		for _, n := range t.needs {
			_, typeNeeded := neededTypes[n]
			if !declared[n] && !slices.Contains(neededErrors, n) && !typeNeeded { // those are reported above
				k := miss{capability, n}
				users[k] = append(users[k], t.what)
			}
		}
	}
	keys := make([]miss, 0, len(users))
	for k := range users {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].capability != keys[j].capability {
			return keys[i].capability < keys[j].capability
		}
		return keys[i].name < keys[j].name
	})
	for _, k := range keys {
		at := pos{s.File, 1, 1}
		if c := s.caps[k.capability]; c != nil {
			at = c.Pos
		}
		whats := users[k]
		sort.Strings(whats)
		whats = slices.Compact(whats)
		if k.capability != "" {
			e.add(at, "capability %s: %s %s %s, which the spec does not declare", k.capability, strings.Join(whats, " and "), plural(len(whats), "needs", "need"), k.name)
		} else {
			e.add(at, "%s %s %s, which the spec does not declare", strings.Join(whats, " and "), plural(len(whats), "needs", "need"), k.name)
		}
	}
}

// templateNeed is one template's needs line.
type templateNeed struct {
	what  string   // the generated package it renders into, in words
	needs []string // the names on its needs line
}

// templateNeeds reads the needs line of every template.
func templateNeeds() []templateNeed {
	what := map[string]string{
		"checkedtmpl":     "the checked wrapper",
		"conformancetmpl": "the conformance suite",
		"contracttmpl":    "the contract",
		"fakestmpl":       "the fakes",
	}
	var out []templateNeed
	names, _ := fs.Glob(templates, "*/*.go")
	sort.Strings(names)
	for _, n := range names {
		text, err := fs.ReadFile(templates, n)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(text), "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), tmplMarker+"needs "); ok {
				out = append(out, templateNeed{what: what[path.Dir(n)], needs: strings.Fields(rest)})
				break
			}
			if strings.HasPrefix(line, "package ") {
				break // a needs line comes before the package clause
			}
		}
	}
	return out
}

// declaredNames returns every name a spec declares, as templates' needs
// spell them: capabilities, Capability.Method, types, enum values
// (TypeValue) and errors.
func (s *Spec) declaredNames() map[string]bool {
	out := map[string]bool{}
	for _, c := range s.Capabilities {
		out[c.Name] = true
		for _, m := range c.Methods {
			out[c.Name+"."+m.Name] = true
		}
	}
	for _, t := range s.Types {
		out[t.Name] = true
		if t.Kind == kindEnum {
			for _, v := range t.Values {
				out[t.Name+v.Name] = true
			}
		}
	}
	for _, e := range s.Errors {
		out[e.Name] = true
	}
	return out
}
