package gen

import (
	"bytes"
	"embed"
	"fmt"
	"go/format"
	"go/scanner"
	"go/token"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// The parts of the generated packages that do not vary with the spec are
// plain Go, written by hand in a directory of this package per generated
// package (checkedtmpl, conformancetmpl, contracttmpl, fakestmpl) and copied
// into the output with a few marked substitutions. They are ordinary Go files
// of the package they are copied into, written for memgen's own spec, so that
// gofmt, go vet and an editor see them; their first line
//
//	//go:build memgentmpl
//
// keeps them out of every normal build. A template directory is not a package
// of its own (the generated half of its package is not there), so the tag is
// not meant for go build or go vet over ./gen/...: make tmpl-vet gives go vet
// -tags memgentmpl an overlay that puts each template in place of its copy in
// the package it renders into, so that it is type-checked and vetted with the
// generated code it calls, and reported at its own path and line.
//
// Rendering a template:
//
//   - "// memgen:needs A B.M ..." (its own comment group, before the package
//     clause) leaves the whole file out unless the spec declares every name:
//     capabilities, Capability.Method, types, enum values (TypeValue), errors.
//     A name that is not a capability is a requirement, not a condition: when
//     the spec declares the capabilities a needs line names, the loader
//     demands the rest (validateTemplateNeeds).
//   - "// memgen:if A B", optionally "// memgen:else", and "// memgen:end",
//     each alone on its line, keep the lines between them only when the spec
//     declares the names (or only when it does not, after else). The marker
//     lines themselves are cut; blocks do not nest.
//   - The marked identifiers are substituted where they appear as tokens: the
//     package clause's name (the last element of the output directory), the
//     string literal tmplContract (the contract's import path), the string
//     literal tmplModule (the module path), and the contract's interfaces of
//     the grant and account roles, which the templates name memapi.Grant and
//     memapi.Account (imported as memapi): the spec's own names for them.
//
// Then the header is put on (naming the template, by its path from the
// module root: gen/checkedtmpl/audit.go) and the file is gofmt'ed.
const (
	tmplTag      = "memgentmpl"
	tmplModule   = "github.com/memgen/memgen"
	tmplContract = tmplModule + "/generated/memapi"
)

// templates holds every template directory.
//
//go:embed checkedtmpl/*.go conformancetmpl/*.go contracttmpl/*.go fakestmpl/*.go
var templates embed.FS

// tmplMarker is the prefix of a template's marker lines.
const tmplMarker = "// memgen:"

// goTemplate is one rendered template: the file name it is written under and
// its gofmt'ed source, header included.
type goTemplate struct {
	name string
	src  []byte
}

// renderTemplates renders every template of fsys that pattern matches (a
// directory's "dir/*.go", or one file) and whose needs the spec meets, for the
// output package pkg, in file-name order.
func (g *generator) renderTemplates(fsys fs.FS, pattern, pkg string) ([]goTemplate, error) {
	names, err := fs.Glob(fsys, pattern)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	declared := g.Spec.declaredNames()
	var out []goTemplate
	for _, n := range names {
		text, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, err
		}
		src, ok, err := renderTemplate(text, g.header(tmplRoot+n), pkg, declared, substitutions{
			literals: map[string]string{
				strconv.Quote(tmplContract): strconv.Quote(g.Contract()),
				strconv.Quote(tmplModule):   strconv.Quote(g.Config.Module),
			},
			contract: map[string]string{
				"Grant":   roleName(g.Spec, roleGrant),
				"Account": roleName(g.Spec, roleAccount),
			},
		})
		if err != nil {
			return nil, fmt.Errorf("template %s: %w", n, err)
		}
		if ok {
			out = append(out, goTemplate{name: path.Base(n), src: src})
		}
	}
	return out, nil
}

// substitutions are a template's marked tokens besides its package clause:
// literals maps a string literal, quoted, to its replacement, and contract
// an identifier the template selects from the contract package (memapi.X)
// to the spec's name for it.
type substitutions struct {
	literals, contract map[string]string
}

// renderTemplate renders one template (see above) under header: ok is false
// when its needs are not met.
func renderTemplate(text []byte, header, pkg string, declared map[string]bool, subs substitutions) (out []byte, ok bool, err error) {
	lines := strings.Split(string(text), "\n")
	if len(lines) == 0 || lines[0] != "//go:build "+tmplTag {
		return nil, false, fmt.Errorf("the first line is not //go:build %s", tmplTag)
	}
	meets := func(names []string) bool {
		for _, n := range names {
			if !declared[n] {
				return false
			}
		}
		return true
	}
	var kept []string
	const (
		outside = iota
		inIf
		inElse
	)
	state, keep, ifLine := outside, true, 0
	for i, line := range lines[1:] {
		before, rest, marked := strings.Cut(strings.TrimSpace(line), tmplMarker)
		if !marked || before != "" {
			if keep {
				kept = append(kept, line)
			}
			continue
		}
		verb, args, _ := strings.Cut(rest, " ")
		names := strings.Fields(args)
		switch {
		case verb == "needs" && len(names) > 0:
			if !meets(names) {
				return nil, false, nil
			}
		case verb == "if" && len(names) > 0 && state == outside:
			state, keep, ifLine = inIf, meets(names), i+2
		case verb == "else" && len(names) == 0 && state == inIf:
			state, keep = inElse, !keep
		case verb == "end" && len(names) == 0 && state != outside:
			state, keep = outside, true
		default:
			return nil, false, fmt.Errorf("line %d: misplaced or unknown marker %q", i+2, strings.TrimSpace(line))
		}
	}
	if state != outside {
		return nil, false, fmt.Errorf("line %d: memgen:if without memgen:end", ifLine)
	}
	body, err := substitute([]byte(strings.Join(kept, "\n")), pkg, subs)
	if err != nil {
		return nil, false, err
	}
	src, err := format.Source(append([]byte(header+"\n\n"), body...))
	if err != nil {
		return nil, false, fmt.Errorf("gofmt: %w", err)
	}
	return src, true, nil
}

// substitute replaces, token by token, the package clause's name with pkg,
// every string literal that subs.literals maps, and every identifier that
// subs.contract maps where it is selected from the contract (memapi.X).
func substitute(src []byte, pkg string, subs substitutions) ([]byte, error) {
	fset := token.NewFileSet()
	file := fset.AddFile("", -1, len(src))
	var errs scanner.ErrorList
	var s scanner.Scanner
	s.Init(file, src, func(p token.Position, msg string) { errs.Add(p, msg) }, 0)
	var out bytes.Buffer
	last, afterPackage, renamed := 0, false, false
	var prev [2]string // the two tokens before this one, as selectors are matched
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		off := file.Offset(pos)
		repl, ok := "", false
		switch {
		case afterPackage && tok == token.IDENT:
			repl, ok, renamed = pkg, true, true
		case tok == token.STRING:
			repl, ok = subs.literals[lit]
		case tok == token.IDENT && prev == [2]string{"memapi", "."}:
			repl, ok = subs.contract[lit]
			ok = ok && repl != ""
		}
		afterPackage = tok == token.PACKAGE
		prev[0], prev[1] = prev[1], lit
		if tok == token.PERIOD {
			prev[1] = "."
		}
		if ok {
			out.Write(src[last:off])
			out.WriteString(repl)
			last = off + len(lit)
		}
	}
	if errs.Len() > 0 {
		return nil, errs.Err()
	}
	if !renamed {
		return nil, fmt.Errorf("no package clause")
	}
	out.Write(src[last:])
	return out.Bytes(), nil
}
