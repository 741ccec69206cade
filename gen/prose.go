package gen

import "strings"

// commentWidth is the width generated doc comments are wrapped to, counting
// the "// " prefix but not the indentation.
const commentWidth = 80

// commentWrapped writes text as // lines wrapped to commentWidth. Blank lines
// separate paragraphs; lines starting with a tab or "- " are kept as they are
// (code and lists).
func commentWrapped(c commenter, text string) {
	comment(c, wrapText(text, commentWidth-3))
}

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
			if strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "- ") {
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

// sentence returns s trimmed, with its first letter upper-cased and a final
// period when it ends without punctuation.
func sentence(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return s
	}
	s = strings.ToUpper(s[:1]) + s[1:]
	if !strings.ContainsAny(s[len(s)-1:], ".!?:") {
		s += "."
	}
	return s
}
