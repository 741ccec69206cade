package gen

import (
	"strings"

	. "github.com/dave/jennifer/jen"
)

// commentWidth is the width generated doc comments are wrapped to, counting
// the "// " prefix but not the indentation.
const commentWidth = 80

// wrapText fills each paragraph of text to width columns.
func wrapText(text string, width int) string {
	var out []string
	for _, para := range strings.Split(text, "\n\n") {
		var lines []string
		var cur strings.Builder
		flush := func() {
			if cur.Len() > 0 {
				lines = append(lines, cur.String())
				cur.Reset()
			}
		}
		for _, l := range strings.Split(para, "\n") {
			if strings.HasPrefix(l, "\t") || strings.HasPrefix(l, " ") || strings.HasPrefix(l, "- ") {
				flush()
				lines = append(lines, l)
				continue
			}
			for _, w := range strings.Fields(l) {
				if cur.Len() > 0 && cur.Len()+1+len(w) > width {
					flush()
				}
				if cur.Len() > 0 {
					cur.WriteByte(' ')
				}
				cur.WriteString(w)
			}
		}
		flush()
		out = append(out, strings.Join(lines, "\n"))
	}
	return strings.Join(out, "\n\n")
}

// sentence returns s trimmed, with a final period when it ends without
// punctuation.
func sentence(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return s
	}
	if !strings.ContainsAny(s[len(s)-1:], ".!?:") {
		s += "."
	}
	return s
}

// upperFirst returns s with its first letter upper-cased.
func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

type commenter interface{ Comment(string) *Statement }

// comment writes text as // lines, each paragraph filled to commentWidth
// (jennifer would make a /* */ block of a multi-line comment, which Go doc
// comments avoid). Lines that start with a tab, a space or "- " (code and
// lists) are kept as they are.
func comment(c commenter, text string) {
	for _, l := range strings.Split(wrapText(text, commentWidth-3), "\n") {
		c.Comment(l)
	}
}
