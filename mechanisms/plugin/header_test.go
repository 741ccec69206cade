package plugin

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestHeaderCompiles compiles a translation unit that includes the generated
// header as C11 and as C++17 with every warning an error: the header's own
// static assertions check each struct's size and offsets there.
func TestHeaderCompiles(t *testing.T) {
	dir := t.TempDir()
	src := "#include \"memgen/mechanism.h\"\nconst memgen_plugin *memgen_plugin_v2(uint32_t v) { (void)v; return 0; }\n"
	for _, c := range []struct {
		lang, file string
		compilers  []string
		flags      []string
	}{
		{"C11", "h.c", []string{cc(t)}, []string{"-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"}},
		{"C++17", "h.cc", []string{os.Getenv("CXX"), "c++", "g++", "clang++"}, []string{"-std=c++17", "-Wall", "-Wextra", "-Werror"}},
	} {
		t.Run(c.lang, func(t *testing.T) {
			var compiler string
			for _, x := range c.compilers {
				if p, err := exec.LookPath(x); x != "" && err == nil {
					compiler = p
					break
				}
			}
			if compiler == "" {
				t.Skipf("no %s compiler on PATH", c.lang)
			}
			file := filepath.Join(dir, c.file)
			if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			args := append(append([]string{}, c.flags...), "-I"+includeDir, "-c", "-o", filepath.Join(dir, c.file+".o"), file)
			if out, err := exec.Command(compiler, args...).CombinedOutput(); err != nil {
				t.Fatalf("%s %s: %v\n%s", compiler, strings.Join(args, " "), err, out)
			}
		})
	}
}

// TestLayoutMatchesC builds a C program that prints sizeof and offsetof of
// every struct and member of the header, and checks that they equal both
// what memgen computed (the generated cLayouts) and the loader's Go mirrors.
func TestLayoutMatchesC(t *testing.T) {
	compiler := cc(t)
	var prog strings.Builder
	prog.WriteString("#include <stdio.h>\n#include \"memgen/mechanism.h\"\nint main(void) {\n")
	for _, l := range cLayouts {
		fmt.Fprintf(&prog, "  printf(\"%s %%zu\\n\", sizeof(%s));\n", l.C, l.C)
		for _, m := range l.Members {
			fmt.Fprintf(&prog, "  printf(\"%s.%s %%zu\\n\", offsetof(%s, %s));\n", l.C, m.C, l.C, m.C)
		}
	}
	prog.WriteString("  return 0;\n}\n")
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "layout.c"), filepath.Join(dir, "layout")
	if err := os.WriteFile(src, []byte(prog.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(compiler, append(append([]string{}, cFlags...), "-o", bin, src)...).CombinedOutput(); err != nil {
		t.Fatalf("building the layout program: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	fromC := map[string]uintptr{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("layout program printed %q", sc.Text())
		}
		fromC[k] = uintptr(n)
	}
	checked := 0
	for _, l := range cLayouts {
		if got := fromC[l.C]; got != l.Size || l.Go.Size() != l.Size {
			t.Errorf("sizeof(%s): C says %d, memgen computed %d, Go mirror %s has %d", l.C, got, l.Size, l.Go, l.Go.Size())
		}
		if l.Go.NumField() != len(l.Members) {
			t.Errorf("%s: Go mirror %s has %d fields, the header %d members", l.C, l.Go, l.Go.NumField(), len(l.Members))
		}
		for _, m := range l.Members {
			f, ok := l.Go.FieldByName(m.Go)
			if !ok {
				t.Errorf("%s.%s: Go mirror %s has no field %s", l.C, m.C, l.Go, m.Go)
				continue
			}
			if got := fromC[l.C+"."+m.C]; got != m.Off || f.Offset != m.Off {
				t.Errorf("offsetof(%s, %s): C says %d, memgen computed %d, Go mirror %s.%s is at %d", l.C, m.C, got, m.Off, l.Go, m.Go, f.Offset)
			}
			checked++
		}
	}
	if checked < 40 || len(cLayouts) < 8 {
		t.Errorf("only %d members of %d structs checked", checked, len(cLayouts))
	}
}
