// Package clihelp writes the help of memgen's commands (memgen, memctl,
// memdemo) within Width columns: the flags as flag.PrintDefaults lists
// them, their descriptions wrapped, and paragraphs of text wrapped.
package clihelp

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// Width is the columns help fits in.
const Width = 80

// Wrap breaks s into lines of at most width columns at spaces, the first
// prefixed by first and the others by rest (a word longer than a line
// stays whole).
func Wrap(s string, width int, first, rest string) string {
	var b strings.Builder
	line, prefix := "", first
	flush := func() {
		b.WriteString(prefix + line + "\n")
		line, prefix = "", rest
	}
	for _, word := range strings.Fields(s) {
		if line != "" && len(prefix)+len(line)+1+len(word) > width {
			flush()
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" || b.Len() == 0 {
		flush()
	}
	return b.String()
}

// Flags writes fs's flags as flag.PrintDefaults does ("  -name type" and
// the description below it), each description wrapped within Width
// columns with its default appended.
func Flags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		head := "  -" + f.Name
		if name != "" {
			head += " " + name
		}
		if def := f.DefValue; !zero(def) {
			if fmt.Sprintf("%T", f.Value) == "*flag.stringValue" {
				def = fmt.Sprintf("%q", def) // as flag.PrintDefaults quotes a string's
			}
			usage += " (default " + def + ")"
		}
		fmt.Fprintln(w, head)
		fmt.Fprint(w, Wrap(usage, Width, "        ", "        "))
	})
}

// zero reports whether a flag's default is its type's zero value, which
// flag.PrintDefaults leaves out too.
func zero(def string) bool {
	switch def {
	case "", "0", "false", "0s", "[]":
		return true
	}
	return false
}
