package gen

import "strings"

// validateCycles reports value types that contain themselves: a struct
// holding a struct that holds the first (directly or through others) has no
// finite size, and Go rejects it as an invalid recursive type. Handles are
// pointers, so a field of handle type never closes a cycle. Each cycle is
// reported once, at the field of the earliest-declared struct on it.
func validateCycles(s *Spec, e *errs) {
	const (
		unvisited = iota
		onPath
		done
	)
	state := map[string]int{}
	type step struct {
		t *typeDecl
		f *field
	}
	var path []step
	var visit func(t *typeDecl)
	visit = func(t *typeDecl) {
		state[t.Name] = onPath
		for _, f := range t.Fields {
			u := s.types[f.Type]
			if u == nil || u.Kind != kindStruct || f.Type == t.Name {
				continue // self-reference is reported by validateType
			}
			path = append(path, step{t, f})
			switch state[u.Name] {
			case unvisited:
				visit(u)
			case onPath:
				start := 0
				for i, st := range path {
					if st.t.Name == u.Name {
						start = i
					}
				}
				cyc := path[start:]
				names := make([]string, 0, len(cyc)+1)
				for _, st := range cyc {
					names = append(names, st.t.Name+"."+st.f.Name)
				}
				names = append(names, u.Name)
				e.add(cyc[0].f.Pos, "type %s: holds itself by value (%s): a struct cannot contain itself; make one of the types a handle", cyc[0].t.Name, strings.Join(names, " -> "))
			}
			path = path[:len(path)-1]
		}
		state[t.Name] = done
	}
	for _, t := range s.Types {
		if t.Kind == kindStruct && state[t.Name] == unvisited && s.types[t.Name] == t {
			visit(t)
		}
	}
}
