package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/memgen/memgen/gen"
	"go.yaml.in/yaml/v3"
)

func init() {
	commands["new"] = command{
		args:    " mechanism NAME",
		example: "memgen new mechanism arena -offers DeviceAllocator,VirtualBacking",
		help: "Adds mechanism NAME to the spec and writes its starting point, then\n" +
			"generates: the spec gains an entry under mechanisms: (package, type,\n" +
			"device, offers, granularity, doc, from the flags), and the package\n" +
			"directory gets doc.go, mechanism.go (Options, New, Info, DeviceAllocator),\n" +
			"a file per optional capability offered, context.go (the device context)\n" +
			"and conformance_test.go, which runs the conformance suite bare and through\n" +
			"the checked wrapper. The package compiles and memgen check passes at once;\n" +
			"every method still to be written returns an ErrUnsupported error saying\n" +
			"so, and go test fails naming each until it is written.\n\n" +
			"Refuses (exit 3, nothing written) a name the spec already has and a package\n" +
			"directory that already holds Go files; flags that make an entry the spec\n" +
			"rejects are a usage error (exit 2, nothing written).",
		flags: func(fs *flag.FlagSet, o *options) {
			fs.StringVar(&o.newType, "type", "Mechanism", "the exported type to write; *TYPE is the mechanism")
			fs.StringVar(&o.newPackage, "package", "", "the module-relative package directory (default mechanisms/NAME)")
			fs.StringVar(&o.newDevice, "device", "Host", "the device kind: Host or CUDA")
			fs.StringVar(&o.newOffers, "offers", "DeviceAllocator", "the capabilities offered, comma-separated (DeviceAllocator is required;\nVirtualBacking and SharedMapping are optional)")
			fs.StringVar(&o.newGranularity, "granularity", "page", "where the granularity comes from: page, configurable or device")
			fs.StringVar(&o.newDoc, "doc", "", "one sentence for the spec's doc (default: \"Mechanism NAME.\")")
		},
		run:        runNew,
		positional: true,
	}
}

// mechanismName is what `memgen new mechanism` accepts as a name: a spec
// key that is also a Go package name (the default directory's last
// element).
var mechanismName = regexp.MustCompile(`^[a-z][a-z0-9]*$`)

func runNew(o *options, stdout, stderr io.Writer) int {
	if len(o.args) != 2 || o.args[0] != "mechanism" {
		fmt.Fprintf(stderr, "memgen new: want: memgen new mechanism NAME, got %q\n", o.args)
		return exitUsage
	}
	name := o.args[1]
	if !mechanismName.MatchString(name) {
		fmt.Fprintf(stderr, "memgen new: mechanism name %q: want lower-case letters and digits, starting with a letter (it names the package too)\n", name)
		return exitUsage
	}
	p, code := load(o, stderr)
	if p == nil {
		return code
	}
	for _, m := range p.spec.Mechanisms {
		if m.Name == name {
			fmt.Fprintf(stderr, "memgen new: the spec already declares mechanism %s (package %s): nothing written\n", name, m.Package)
			return exitRefused
		}
	}
	dir := o.newPackage
	if dir == "" {
		dir = "mechanisms/" + name
	}
	dir = path.Clean(filepath.ToSlash(dir))
	if gos, _ := filepath.Glob(filepath.Join(p.root, filepath.FromSlash(dir), "*.go")); len(gos) > 0 {
		fmt.Fprintf(stderr, "memgen new: %s already holds Go files (%s): nothing written; choose another -package\n", dir, filepath.Base(gos[0]))
		return exitRefused
	}
	specPath := filepath.Join(p.root, filepath.FromSlash(o.spec))
	old, err := os.ReadFile(specPath)
	if err != nil {
		fmt.Fprintln(stderr, "memgen new:", err)
		return exitSpec
	}
	doc := o.newDoc
	if doc == "" {
		doc = "Mechanism " + name + "."
	}
	entry, err := specEntry(name, dir, o.newType, o.newDevice, o.newOffers, o.newGranularity, doc)
	if err != nil {
		fmt.Fprintln(stderr, "memgen new:", err)
		return exitUsage
	}
	updated, err := insertMechanism(old, entry)
	if err != nil {
		fmt.Fprintf(stderr, "memgen new: %s: %v: nothing written\n", o.spec, err)
		return exitSpec
	}
	// The new spec must load and generate before anything is written.
	s, err := gen.Load(filepath.ToSlash(o.spec), updated)
	if err != nil {
		fmt.Fprintf(stderr, "memgen new: the spec rejects the entry the flags make, nothing written:\n%v\n", err)
		return exitUsage
	}
	p.spec = s
	skel, err := gen.Skeleton(s, p.config(), name)
	if err != nil {
		fmt.Fprintln(stderr, "memgen new:", err)
		return exitSpec
	}
	files, err := p.generate()
	if err != nil {
		fmt.Fprintln(stderr, "memgen new: generate:", err)
		return exitSpec
	}
	// Written in order: the starting point (new files only), the spec, then
	// the generated files (so that the new package's glue sees it written).
	// A failure takes back what was written: nothing is left half added.
	var made []string
	undo := func(err error) int {
		for _, m := range made {
			os.Remove(m)
		}
		fmt.Fprintln(stderr, "memgen new:", err)
		return exitSpec
	}
	for _, rel := range slices.Sorted(maps.Keys(skel)) {
		target := filepath.Join(p.root, filepath.FromSlash(rel))
		err := os.MkdirAll(filepath.Dir(target), 0o755)
		if err == nil {
			err = writeNew(target, skel[rel])
		}
		if err != nil {
			return undo(err)
		}
		made = append(made, target)
	}
	if err := os.WriteFile(specPath, updated, 0o644); err != nil {
		return undo(err)
	}
	if _, _, err := gen.Write(p.root, files); err != nil {
		if rerr := os.WriteFile(specPath, old, 0o644); rerr != nil {
			err = fmt.Errorf("%w; and restoring %s: %v", err, o.spec, rerr)
		}
		return undo(fmt.Errorf("generate: %w", err))
	}
	fmt.Fprintf(stdout, "memgen new: mechanism %s: added to %s; wrote %s (%s) and generated the glue\n", name, o.spec, dir, strings.Join(baseNames(skel), ", "))
	fmt.Fprintf(stdout, "next: go test ./%s/ fails naming each method to write; write them (mechanisms/example shows how), then memgen check\n", dir)
	return exitOK
}

// specEntry is the mechanism's entry in the spec's mechanisms: section.
func specEntry(name, dir, typ, device, offers, granularity, doc string) ([]byte, error) {
	var list []string
	for _, c := range strings.Split(offers, ",") {
		if c = strings.TrimSpace(c); c != "" {
			list = append(list, c)
		}
	}
	docYAML, err := yaml.Marshal(doc)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "  %s:\n", name)
	fmt.Fprintf(&b, "    package: %s\n", dir)
	fmt.Fprintf(&b, "    type: %s\n", typ)
	fmt.Fprintf(&b, "    device: %s\n", device)
	fmt.Fprintf(&b, "    offers: [%s]\n", strings.Join(list, ", "))
	fmt.Fprintf(&b, "    granularity: %s\n", granularity)
	fmt.Fprintf(&b, "    doc: %s", docYAML)
	return b.Bytes(), nil
}

// insertMechanism puts entry at the end of the spec's top-level mechanisms:
// section, before the blank lines and comments that lead to the next
// top-level key, keeping every other byte of the file.
func insertMechanism(spec, entry []byte) ([]byte, error) {
	lines := strings.SplitAfter(string(spec), "\n")
	start := -1
	for i, l := range lines {
		if strings.TrimRight(l, " \r\n") == "mechanisms:" {
			start = i
			break
		}
	}
	if start < 0 {
		return nil, fmt.Errorf("no top-level mechanisms: section")
	}
	end := len(lines)
	for i := start + 1; i < len(lines); i++ {
		if l := lines[i]; l != "" && l[0] != ' ' && l[0] != '\t' && l[0] != '\n' && l[0] != '\r' && l[0] != '#' {
			end = i
			break
		}
	}
	at := end
	for at > start+1 {
		l := strings.TrimSpace(lines[at-1])
		if l != "" && !strings.HasPrefix(lines[at-1], "#") {
			break
		}
		at--
	}
	var b strings.Builder
	for _, l := range lines[:at] {
		b.WriteString(l)
	}
	if at > 0 && !strings.HasSuffix(lines[at-1], "\n") {
		b.WriteString("\n")
	}
	b.Write(entry)
	for _, l := range lines[at:] {
		b.WriteString(l)
	}
	return []byte(b.String()), nil
}

// writeNew creates a file that must not exist yet.
func writeNew(target string, data []byte) error {
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func baseNames(m map[string][]byte) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, path.Base(k))
	}
	return out
}
