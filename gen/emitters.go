package gen

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// emitter writes one part of the output. Emitters register themselves from
// init functions, one file each. Like go/analysis's Analyzer, an emitter
// names the emitters whose output its own refers to (Requires); Generate
// runs every emitter after those it requires, and Emit reads their results
// with resultOf.
type emitter struct {
	Name string
	// Requires are the emitters this one depends on: their output declares
	// what this one's refers to, and their results (resultOf) are ready
	// when Emit runs.
	Requires []*emitter
	// Emit writes the emitter's files and returns its result for the
	// emitters that require it (nil when it has none). An emitter whose Emit
	// fails is reported, and the emitters that require it, directly or not,
	// do not run.
	Emit func(g *generator) (any, error)
}

var emitters []*emitter

// noResult adapts the Emit of an emitter that has no result.
func noResult(emit func(g *generator) error) func(g *generator) (any, error) {
	return func(g *generator) (any, error) { return nil, emit(g) }
}

func register(e *emitter) { emitters = append(emitters, e) }

// emitterOrder returns es and every emitter they require, each after the
// emitters it requires; among the emitters that may go next, the first by
// Name goes first, so the order is the same on every run. A cycle of
// Requires is an error naming it.
func emitterOrder(es []*emitter) ([]*emitter, error) {
	all := map[*emitter]bool{}
	var add func(e *emitter)
	add = func(e *emitter) {
		if !all[e] {
			all[e] = true
			for _, r := range e.Requires {
				add(r)
			}
		}
	}
	for _, e := range es {
		add(e)
	}
	names := map[string]*emitter{}
	for e := range all {
		if other, ok := names[e.Name]; ok && other != e {
			return nil, fmt.Errorf("two emitters are named %q", e.Name)
		}
		names[e.Name] = e
	}
	done := map[*emitter]bool{}
	var order []*emitter
	for len(order) < len(all) {
		var ready []*emitter
		for e := range all {
			if !done[e] && requiresDone(e, done) {
				ready = append(ready, e)
			}
		}
		if len(ready) == 0 {
			return nil, fmt.Errorf("emitters require each other in a cycle: %s", emitterCycle(all, done))
		}
		sort.Slice(ready, func(i, j int) bool { return ready[i].Name < ready[j].Name })
		done[ready[0]] = true
		order = append(order, ready[0])
	}
	return order, nil
}

func requiresDone(e *emitter, done map[*emitter]bool) bool {
	for _, r := range e.Requires {
		if !done[r] {
			return false
		}
	}
	return true
}

// emitterCycle describes one cycle among the emitters not done: following,
// from the first by name, each one's first requirement not done must come
// back to an emitter already on the path.
func emitterCycle(all, done map[*emitter]bool) string {
	var first *emitter
	for e := range all {
		if !done[e] && (first == nil || e.Name < first.Name) {
			first = e
		}
	}
	at := map[*emitter]int{}
	var path []string
	for e := first; ; {
		if i, ok := at[e]; ok {
			return strings.Join(append(path[i:], e.Name), " -> ")
		}
		at[e] = len(path)
		path = append(path, e.Name)
		for _, r := range e.Requires {
			if !done[r] {
				e = r
				break
			}
		}
	}
}

// resultOf returns the result of emitter e, which the running emitter must
// require: reading the result of an emitter it does not name is a bug of
// the generator, and panics.
func resultOf[T any](g *generator, e *emitter) T {
	if g.current == nil || !slices.Contains(g.current.Requires, e) {
		panic(fmt.Sprintf("gen: emitter %s reads the result of %s, which it does not require", g.emitterName(), e.Name))
	}
	r, ok := g.results[e].(T)
	if !ok {
		panic(fmt.Sprintf("gen: emitter %s's result is %T, not %T", e.Name, g.results[e], r))
	}
	return r
}

// run runs es in order (see emitterOrder), skipping an emitter that requires
// one that failed, and records every error of the run.
func (g *generator) run(es []*emitter) {
	order, err := emitterOrder(es)
	if err != nil {
		g.Errorf(pos{g.Spec.File, 1, 1}, "%v", err)
		return
	}
	failed := map[*emitter]bool{}
	for _, e := range order {
		if failedRequirement(e, failed) {
			failed[e] = true
			continue
		}
		g.current = e
		res, err := e.Emit(g)
		g.current = nil
		if err != nil {
			failed[e] = true
			g.emitError(e.Name, err)
			continue
		}
		g.results[e] = res
	}
}

func failedRequirement(e *emitter, failed map[*emitter]bool) bool {
	for _, r := range e.Requires {
		if failed[r] {
			return true
		}
	}
	return false
}
