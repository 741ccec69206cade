package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/memgen/memgen/gen"
	"github.com/memgen/memgen/internal/clihelp"
	"golang.org/x/mod/modfile"
)

// The exit codes, shared with memctl and memdemo (clihelp.ExitCodes).
const (
	exitOK      = clihelp.ExitOK
	exitSpec    = clihelp.ExitFailed // a spec, drift or check error
	exitUsage   = clihelp.ExitUsage
	exitRefused = clihelp.ExitRefused // memgen new: the name or the directory is taken
)

const usage = `usage: memgen <command> [flags]

commands:
  generate   write every generated file from the spec (go generate ./...
             runs this)
  check      validate the spec; fail on drift (generated files that differ, are
             missing or are stale) and on mechanism packages that implement more
             or less than the spec declares
  doc        write docs/capabilities.md from the spec
  new mechanism NAME
             add a mechanism to the spec and write its starting point: a
             package that compiles and runs the conformance suite
  plugin-check PATH.so
             load a C plugin by path and run the conformance suite on it,
             against its own descriptor; print a report (exit 1 on a failure)
  version    print memgen's module version, VCS revision and Go version
  help       print this, or with a command's name its flags

Run memgen <command> --help (or memgen help <command>) for a command's
flags and an example.

` + clihelp.ExitCodes + `memgen: 1 is a spec, drift or check error or a failed plugin-check; 3 is
memgen new refusing a name or a directory already taken.
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help", "help":
		if len(args) == 1 || args[0] == "help" && len(args) == 2 && (args[1] == "help" || args[1] == "-h" || args[1] == "--help") {
			fmt.Fprint(stdout, usage)
			return exitOK
		}
		if _, ok := commands[args[1]]; len(args) > 2 || !ok && args[1] != "version" {
			fmt.Fprintf(stderr, "memgen help: want one command's name, got %q\n\n%s", args[1:], usage)
			return exitUsage
		}
		return run([]string{args[1], "--help"}, stdout, stderr)
	case "version":
		return runVersion(args[1:], stdout, stderr)
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "memgen: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	fs := flag.NewFlagSet("memgen "+args[0], flag.ContinueOnError)
	// Usage goes to stdout when asked for (--help, exit 0) and to stderr
	// after a usage error (exit 2).
	var flagOut strings.Builder
	fs.SetOutput(&flagOut)
	opts := &options{}
	fs.StringVar(&opts.root, "root", "", "module root (default: the directory of the nearest go.mod above the working directory)")
	fs.StringVar(&opts.spec, "spec", "spec/capabilities.yaml", "spec file, relative to the module root")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: memgen %s [flags]%s\n\n%s\n\nflags:\n", args[0], cmd.args, cmd.help)
		clihelp.Flags(fs.Output(), fs)
		fmt.Fprintf(fs.Output(), "\nexample:\n  %s\n", cmd.example)
	}
	if cmd.flags != nil {
		cmd.flags(fs, opts)
	}
	// Flags may come before, between or after the positional arguments
	// (memgen new mechanism arena -offers ...); after "--" everything is
	// positional.
	var positional []string
	for rest := args[1:]; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				io.WriteString(stdout, flagOut.String())
				return exitOK
			}
			io.WriteString(stderr, flagOut.String())
			return exitUsage
		}
		if n := len(rest) - fs.NArg(); fs.NArg() == 0 || n > 0 && rest[n-1] == "--" {
			positional = append(positional, fs.Args()...)
			break
		}
		positional = append(positional, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	fs.SetOutput(stderr)
	if len(positional) > 0 && !cmd.positional {
		fmt.Fprintf(stderr, "memgen %s: unexpected arguments %q\n", args[0], positional)
		fs.Usage()
		return exitUsage
	}
	opts.args = positional
	return cmd.run(opts, stdout, stderr)
}

type options struct {
	root, spec string
	out        string // doc: output file
	verbose    bool
	args       []string      // the positional arguments of a command that takes them
	config     string        // plugin-check: the plugin's configuration string
	callBound  time.Duration // plugin-check: the bound of every call into the plugin

	// new mechanism: the spec entry's fields
	newType, newPackage, newDevice, newOffers, newGranularity, newDoc string
}

type command struct {
	args       string // the positional arguments in the usage line (" PATH.so")
	example    string // one command line, shown by --help
	help       string
	flags      func(*flag.FlagSet, *options)
	run        func(*options, io.Writer, io.Writer) int
	positional bool // takes positional arguments (run checks them)
}

var commands = map[string]command{
	"generate": {
		example: "memgen generate -v    # or: go generate ./...",
		help:    "Writes every generated file from the spec. Files are written to temporary\nnames and renamed only when all succeeded; stale files carrying memgen's\nheader are removed from its output directories (and stale mechanism glue);\nfiles without the header, or outside those places, are never touched.",
		flags: func(fs *flag.FlagSet, o *options) {
			fs.BoolVar(&o.verbose, "v", false, "list the files written and removed")
		},
		run: runGenerate,
	},
	"check": {
		example: "memgen check          # in CI, after go generate: fails on drift",
		help:    "Validates the spec, regenerates in memory and fails (exit 1) listing every\ngenerated file that differs, is missing or is stale, with a unified diff\n(tree -> spec) of the first that differs; then loads each mechanism package\nnamed in the spec and fails when its type implements a capability the spec\ndoes not declare for it, or lacks one it declares.",
		run:     runCheck,
	},
}

// project is a loaded spec with its module.
type project struct {
	root, module string
	specPath     string // the spec's path relative to root, slash separated
	spec         *gen.Spec
}

func load(o *options, stderr io.Writer) (*project, int) {
	root := o.root
	if root == "" {
		wd, err := os.Getwd()
		if err != nil {
			fmt.Fprintln(stderr, "memgen:", err)
			return nil, exitUsage
		}
		root, err = findRoot(wd)
		if err != nil {
			fmt.Fprintln(stderr, "memgen:", err)
			return nil, exitUsage
		}
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		fmt.Fprintln(stderr, "memgen:", err)
		return nil, exitUsage
	}
	module := modfile.ModulePath(mod)
	data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(o.spec)))
	if err != nil {
		fmt.Fprintln(stderr, "memgen:", err)
		return nil, exitUsage
	}
	s, err := gen.Load(filepath.ToSlash(o.spec), data)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, exitSpec
	}
	return &project{root: root, module: module, specPath: filepath.ToSlash(o.spec), spec: s}, exitOK
}

func findRoot(dir string) (string, error) {
	for d := dir; ; {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", fmt.Errorf("no go.mod above %s (use -root)", dir)
		}
		d = up
	}
}

func (p *project) generate() (map[string][]byte, error) {
	return gen.Generate(p.spec, p.config())
}

// config is what the generator needs to know of the project: the headers it
// writes name the spec by the path memgen was given.
func (p *project) config() gen.Config {
	return gen.Config{Module: p.module, Root: p.root, Spec: p.specPath}
}

func runGenerate(o *options, stdout, stderr io.Writer) int {
	p, code := load(o, stderr)
	if p == nil {
		return code
	}
	files, err := p.generate()
	if err != nil {
		fmt.Fprintln(stderr, "memgen generate:", err)
		return exitSpec
	}
	written, removed, err := gen.Write(p.root, files)
	if err != nil {
		fmt.Fprintln(stderr, "memgen generate:", err)
		return exitSpec
	}
	noteUnwritten(p, stderr)
	if o.verbose {
		for _, f := range written {
			fmt.Fprintln(stdout, "wrote", f)
		}
		for _, f := range removed {
			fmt.Fprintln(stdout, "removed", f)
		}
	}
	return exitOK
}

func runCheck(o *options, stdout, stderr io.Writer) int {
	p, code := load(o, stderr)
	if p == nil {
		return code
	}
	files, err := p.generate()
	if err != nil {
		fmt.Fprintln(stderr, "memgen check:", err)
		return exitSpec
	}
	changed, stale, err := gen.Diff(p.root, files)
	if err != nil {
		fmt.Fprintln(stderr, "memgen check:", err)
		return exitSpec
	}
	failed := false
	shown := false // the diff of the first file that differs
	for _, f := range changed {
		old, err := os.ReadFile(filepath.Join(p.root, filepath.FromSlash(f)))
		if err != nil {
			fmt.Fprintf(stderr, "%s: missing: run go generate ./...\n", f)
		} else {
			fmt.Fprintf(stderr, "%s: differs from the spec: run go generate ./... (never edit generated files)\n", f)
			if !shown {
				shown = true
				io.WriteString(stderr, unifiedDiff(f+" (in the tree)", f+" (from the spec)", old, files[f], maxDiffLines))
			}
		}
		failed = true
	}
	for _, f := range stale {
		fmt.Fprintf(stderr, "%s: stale: generated by memgen but no longer produced; run go generate ./...\n", f)
		failed = true
	}
	if !checkMechanisms(p, stdout, stderr) {
		failed = true
	}
	if failed {
		return exitSpec
	}
	fmt.Fprintf(stdout, "memgen check: ok (%d generated files, spec %s)\n", len(files), strings.TrimSpace(p.spec.Digest[:12]))
	return exitOK
}

const versionHelp = `usage: memgen version

Prints memgen's module path and version, the VCS revision it was built from
(with its time, and whether the tree was modified) and the Go version and
platform, from the build information the Go command records in the binary.
It takes no flags and no arguments.

example:
  memgen version
`

// runVersion is the version verb: no flags but --help.
func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("memgen version", flag.ContinueOnError)
	var flagOut strings.Builder
	fs.SetOutput(&flagOut)
	fs.Usage = func() { fmt.Fprint(fs.Output(), versionHelp) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			io.WriteString(stdout, flagOut.String())
			return exitOK
		}
		io.WriteString(stderr, flagOut.String())
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "memgen version: unexpected arguments %q\n\n%s", fs.Args(), versionHelp)
		return exitUsage
	}
	fmt.Fprintln(stdout, version())
	return exitOK
}
