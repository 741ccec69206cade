// Package gen is memgen's generator library: it loads spec/capabilities.yaml
// through yaml.Node (so every error carries its line and column), validates
// it as a whole (every problem reported at once, as
// "spec/capabilities.yaml:LINE:COL: message"), builds the model (Spec) and
// runs the registered emitters to produce the generated tree: the contract
// (generated/memapi), the checked wrappers, the conformance suite, the fakes,
// each mechanism's glue and docs/capabilities.md.
//
// Load, Generate, Diff and Write are what cmd/memgen is made of:
//
//	s, err := gen.Load("spec/capabilities.yaml", data) // err is an ErrorList
//	files, err := gen.Generate(s, gen.Config{Module: module, Root: root, Spec: "spec/capabilities.yaml"})
//	written, removed, err := gen.Write(root, files)
//
// Output is deterministic and gofmt-clean, and every file starts with a
// header naming the spec, the one emitter that wrote it and, for a copied
// template, the template (see header.go; HeaderPrefix and
// MarkdownHeaderPrefix are how it begins). Golden tests live under
// testdata/; run `go test ./gen -update` after changing an emitter on
// purpose.
//
// # Where things go
//
// An emitter is one file, emit_<output>.go, that declares itself as a value
// (var checkedEmitter = &emitter{Name, Requires, Emit}), registers it from an
// init function and writes one output package or document: emit_contract.go
// (generated/memapi), emit_vet.go and emit_negotiation.go (the contract's
// vet.go and negotiate_test.go), emit_checked.go (generated/checked, and the
// contract's ChargeBook, which only the wrapper uses), emit_conformance.go
// with emit_conformance_rules.go (generated/conformance), emit_fakes.go
// (fakes/), emit_glue.go (each mechanism's zz_generated.memgen.go),
// emit_cabi.go (the plugin C header and its loader's Go mirrors) and
// emit_doc.go (docs/capabilities.md). Each file has exactly one emitter:
// the generator records who wrote every path and fails the run when a
// second emitter writes one.
//
// As with go/analysis's Analyzer.Requires, an emitter names the emitters
// whose output its own refers to, and Generate runs them in a topological
// order (emitters.go; ties by name, a cycle is an error naming it):
//
//	contract                   (the spec alone)
//	├── contract-vet           contract's vet.go
//	├── contract-negotiation-test
//	├── glue                   mechanisms' zz_generated.memgen.go
//	├── cabi                   include/memgen/mechanism.h, loader mirrors
//	├── conformance            generated/conformance
//	└── fakes                  fakes/
//	    └── checked            generated/checked (requires contract and fakes)
//	doc                        docs/capabilities.md (the spec alone)
//
// Emitters meet through what the producer exposes, never through a string
// typed twice: a name the producer declares and the consumer's code names is
// a constant or function beside the producer (contractMechanism,
// contractOf, requireFunc, accessor, capConst, effectConst in
// emit_contract.go; glueSpecName and GlueFile in emit_glue.go; checkedWrap
// in emit_checked.go; fakeCallCount in emit_fakes.go), and what is known
// only once the producer ran is its result, which a consumer that requires
// it reads with resultOf (the fakes emitter's fakesResult, which the checked
// emitter reads to tell that the fakes its examples call are there).
//
// Code whose shape follows the spec (one method, type or subtest per spec
// declaration) is built with jennifer (github.com/dave/jennifer), so names,
// imports and formatting are computed rather than pasted. Code that is the
// same for every spec (the checked wrapper's grant, account and verify-mode
// checks, the contract's ChargeBook and Range methods, the fakes' state
// models, the conformance suite's harness, fixtures, witnesses and
// hand-written scenarios) is plain Go, one file per concept, in a template directory per
// output package: checkedtmpl/, contracttmpl/, fakestmpl/, conformancetmpl/.
// A template is a Go file of the package it is copied into, written for
// memgen's own spec under the build tag memgentmpl, so gofmt and go vet see
// it (make tmpl-vet puts it in place of its copy in that package). template.go
// renders it: "// memgen:needs A B.M ..." leaves the file out when the spec
// lacks one of the capabilities it names, and the loader rejects a spec that
// declares them but lacks another of the names (validate_templates.go), so a
// spec the loader accepts always generates; "// memgen:if A" ... "// memgen:else" ...
// "// memgen:end" cut lines by the same test, the package clause and the
// marked string literals (the contract's import path, the module path) are
// substituted token by token, and the result is gofmt'ed and parsed, so the
// generator learns what a template provides (a fake's state methods, the
// suite's fixtures and witnesses) from its syntax tree.
//
// A fixture is the conformance suite's valid call of one method: a method
// func (e *env) valid<Method>(t T) *call<Method> in the conformancetmpl
// template of its capability (deviceallocator.go, virtualbacking.go,
// sharedmapping.go). Every capability method needs one; a consuming
// method also needs a witness, func (e *env) witness<Method>(t T, c
// *call<Method>) func(memapi.Handle), which checks through the device
// context that the call really did its work. A spec method without its
// fixture or witness is a generation error naming it. A golden case is a
// folder under testdata/: spec.yaml with want_errors.txt (a spec the loader
// must refuse) or expected/ (the files a valid spec generates).
package gen
