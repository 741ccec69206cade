package gen

import (
	"bytes"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// groupImports rewrites the import block of gofmt-formatted Go source the way
// goimports leaves it: the standard library first, then a blank line and the
// module's own packages, each group sorted, and no alias that only repeats
// the last element of the path. Source without a parenthesised import block
// is returned as it is.
func groupImports(src []byte) []byte {
	if m := singleImport.FindSubmatchIndex(src); m != nil {
		alias, p := string(src[m[2]:m[3]]), string(src[m[4]:m[5]])
		if uq, err := strconv.Unquote(p); err == nil && alias == path.Base(uq) {
			return append(append([]byte{}, src[:m[2]]...), src[m[4]:]...)
		}
		return src
	}
	start := bytes.Index(src, []byte("\nimport (\n"))
	if start < 0 {
		return src
	}
	start += len("\nimport (\n")
	end := bytes.Index(src[start:], []byte("\n)\n"))
	if end < 0 {
		return src
	}
	end += start
	var std, other []string
	for _, l := range strings.Split(string(src[start:end]), "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		if strings.HasPrefix(l, "//") {
			return src // a commented block is left to its author
		}
		alias, quoted, ok := strings.Cut(l, " ")
		if !ok {
			alias, quoted = "", l
		}
		p, err := strconv.Unquote(quoted)
		if err != nil {
			return src
		}
		if alias == path.Base(p) {
			l = quoted
		}
		if first, _, _ := strings.Cut(p, "/"); strings.Contains(first, ".") {
			other = append(other, l)
		} else {
			std = append(std, l)
		}
	}
	sort.Slice(std, func(i, j int) bool { return importPath(std[i]) < importPath(std[j]) })
	sort.Slice(other, func(i, j int) bool { return importPath(other[i]) < importPath(other[j]) })
	var b bytes.Buffer
	b.Write(src[:start])
	for _, l := range std {
		b.WriteString("\t" + l + "\n")
	}
	if len(std) > 0 && len(other) > 0 {
		b.WriteString("\n")
	}
	for i, l := range other {
		b.WriteString("\t" + l)
		if i < len(other)-1 {
			b.WriteString("\n")
		}
	}
	if len(other) == 0 && b.Len() > 0 {
		b.Truncate(b.Len() - 1)
	}
	b.Write(src[end:])
	return b.Bytes()
}

var singleImport = regexp.MustCompile(`(?m)^import ([A-Za-z_][A-Za-z0-9_]*) ("[^"]+")$`)

func importPath(l string) string {
	if i := strings.LastIndexByte(l, ' '); i >= 0 {
		l = l[i+1:]
	}
	return l
}
