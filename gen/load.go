package gen

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Load parses and validates a spec. file is the path used in error positions
// (conventionally "spec/capabilities.yaml"). On failure the error is an
// ErrorList holding every problem found, each with its line and column,
// sorted by position.
//
// Checking runs in two passes over one report: the structure (YAML syntax,
// known keys, value shapes, names, expression syntax), then the
// cross-references (declared types and capabilities, grant and account
// parameters, handle effects, name clashes, package layout). Both passes
// always run, so one run lists every problem. A reference is checked only
// against sections that loaded: a section that is missing or not a mapping
// is reported once, not again by every name that would have been declared in
// it, and a name declared twice still resolves to its first declaration.
func Load(file string, data []byte) (*Spec, error) {
	l := &loader{file: file, s: &Spec{File: file}}
	sum := sha256.Sum256(data)
	l.s.Digest = hex.EncodeToString(sum[:])

	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, ErrorList{yamlError(file, data, err)}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil, ErrorList{{Pos: pos{file, 1, 1}, Msg: "empty spec"}}
	}
	l.root(doc.Content[0])
	validate(l.s, &l.e)
	validatePluginABI(l.s, &l.e)
	if len(l.e.list) > 0 {
		return nil, l.e.list.sorted()
	}
	return l.s, nil
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlError turns a parser error into a positioned one. The YAML parser
// reports the line where the construct it was parsing began (a mapping
// that starts at the section's key, hundreds of lines above the bad one),
// not the line of the problem, and no column. The problem's line is the
// first at which the document stops parsing the same way: problemLine
// finds it by parsing prefixes of the document, and the error then says
// both. Its column is that of the line's first character that is not
// blank.
func yamlError(file string, data []byte, err error) *specError {
	msg := err.Error()
	m := yamlLine.FindStringSubmatch(msg)
	if m == nil {
		msg = strings.TrimPrefix(msg, "yaml: ")
		return &specError{Pos: pos{file, 1, 1}, Msg: "yaml: " + msg}
	}
	n, _ := strconv.Atoi(m[1])
	lines := strings.SplitAfter(string(data), "\n")
	if p := problemLine(lines, m[2]); p > 0 && p != n {
		return &specError{Pos: pos{file, p, firstColumn(lines[p-1])}, Msg: fmt.Sprintf("yaml: %s (the parser names line %d, where the enclosing block begins)", m[2], n)}
	}
	col := 1
	if n >= 1 && n <= len(lines) {
		col = firstColumn(lines[n-1])
	}
	return &specError{Pos: pos{file, n, col}, Msg: "yaml: " + m[2]}
}

// problemLine returns the smallest k such that the document's first k
// lines fail to parse with the problem problem, or 0 when that is not
// well defined (a shorter prefix already failing with it, or none at all).
// A prefix of a block-style document ending at a line boundary is itself
// a document, so the prefixes parse until the bad line is in them.
func problemLine(lines []string, problem string) int {
	fails := func(k int) bool {
		var n yaml.Node
		err := yaml.Unmarshal([]byte(strings.Join(lines[:k], "")), &n)
		if err == nil {
			return false
		}
		m := yamlLine.FindStringSubmatch(err.Error())
		return m != nil && m[2] == problem
	}
	lo, hi := 1, len(lines) // fails(hi) holds: the whole document
	if !fails(hi) {
		return 0
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if fails(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if hi > 1 && fails(hi-1) {
		return 0
	}
	return hi
}

// firstColumn is the 1-based column of line's first character that is
// neither a space nor a tab, 1 for a blank line.
func firstColumn(line string) int {
	for i, r := range line {
		if r != ' ' && r != '\t' {
			if r == '\n' || r == '\r' {
				return 1
			}
			return i + 1
		}
	}
	return 1
}

// specKeys lists, per object of the spec language, the keys the loader
// accepts; specRequired the keys it insists on. The JSON Schema
// (spec/capabilities.schema.json) names its definitions after these objects,
// and a test holds the two together.
var specKeys = map[string][]string{
	"spec":             {"version", "packages", "types", "errors", "interfaces", "capabilities", "mechanisms", "invariants", "ownership"},
	"packages":         {"contract", "checked", "conformance", "fakes"},
	"type":             {"kind", "go", "doc", "values", "fields"},
	"error":            {"doc", "wraps"},
	"interface":        {"role", "doc", "methods"},
	"capability":       {"required", "doc", "methods"},
	"interfaceMethod":  {"doc", "params", "returns"},
	"capabilityMethod": {"doc", "params", "returns", "accounting", "creates", "releases", "requires"},
	"accounting":       {"consumes", "refunds", "round", "from", "to"},
	"mechanism":        {"package", "type", "device", "offers", "granularity", "doc"},
	"invariant":        {"says", "enforced_by", "applies_to"},
	"appliesTo":        {"consumes", "releases", "capabilities", "interfaces"},
	"ownership":        {"ledgers", "handles"},
}

var specRequired = map[string][]string{
	"spec":             {"version", "packages", "types", "capabilities", "mechanisms", "invariants"},
	"packages":         {"contract", "checked", "conformance", "fakes"},
	"type":             {"kind", "doc"},
	"error":            {"doc"},
	"capability":       {"doc"},
	"interfaceMethod":  {"doc"},
	"capabilityMethod": {"doc", "accounting"},
	"mechanism":        {"package", "type", "device", "offers", "granularity"},
	"invariant":        {"says", "enforced_by", "applies_to"},
}

type loader struct {
	file string
	s    *Spec
	e    errs
}

func (l *loader) pos(n *yaml.Node) pos { return pos{l.file, n.Line, n.Column} }

type pair struct{ k, v *yaml.Node }

// mapping returns the key/value pairs of n in order, reporting a non-mapping,
// duplicate keys and (when allowed is non-nil) unknown keys.
func (l *loader) mapping(n *yaml.Node, what string, allowed ...string) []pair {
	if n.Kind == yaml.AliasNode {
		l.e.add(l.pos(n), "%s: aliases are not supported", what)
		return nil
	}
	if n.Kind != yaml.MappingNode {
		l.e.add(l.pos(n), "%s: expected a mapping", what)
		return nil
	}
	seen := map[string]bool{}
	var out []pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			l.e.add(l.pos(k), "%s: keys must be plain names", what)
			continue
		}
		if seen[k.Value] {
			l.e.add(l.pos(k), "%s: duplicate name %q", what, k.Value)
			continue
		}
		seen[k.Value] = true
		if allowed != nil && !contains(allowed, k.Value) {
			l.e.add(l.pos(k), "%s: unknown key %q (want one of %s)", what, k.Value, strings.Join(allowed, ", "))
			continue
		}
		out = append(out, pair{k, v})
	}
	return out
}

func (l *loader) str(n *yaml.Node, what string) string {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		l.e.add(l.pos(n), "%s: expected a string", what)
		return ""
	}
	return n.Value
}

func (l *loader) boolean(n *yaml.Node, what string) bool {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		l.e.add(l.pos(n), "%s: expected true or false", what)
		return false
	}
	return n.Value == "true"
}

func (l *loader) strList(n *yaml.Node, what string) ([]string, []pos) {
	if n.Kind != yaml.SequenceNode {
		l.e.add(l.pos(n), "%s: expected a list", what)
		return nil, nil
	}
	var out []string
	var ps []pos
	for _, c := range n.Content {
		if s := l.str(c, what); s != "" {
			out = append(out, s)
			ps = append(ps, l.pos(c))
		}
	}
	return out, ps
}

var identRE = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
var paramRE = regexp.MustCompile(`^[a-z][A-Za-z0-9]*$`)
var idRE = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

func (l *loader) exported(k *yaml.Node, what string) string {
	if !identRE.MatchString(k.Value) {
		l.e.add(l.pos(k), "%s: %q is not an exported Go name", what, k.Value)
	}
	return k.Value
}

func (l *loader) root(n *yaml.Node) {
	if n.Kind == yaml.MappingNode {
		l.s.loaded = map[string]bool{}
	}
	for _, p := range l.mapping(n, "spec", specKeys["spec"]...) {
		if p.k.Value != "version" {
			l.s.loaded[p.k.Value] = p.v.Kind == yaml.MappingNode
		}
		switch p.k.Value {
		case "version":
			v, err := strconv.Atoi(p.v.Value)
			if err != nil || p.v.Kind != yaml.ScalarNode || v != 1 {
				l.e.add(l.pos(p.v), "version: unsupported spec version %q (want 1)", p.v.Value)
			}
			l.s.Version = v
		case "packages":
			l.packages(p.v)
		case "types":
			for _, t := range l.mapping(p.v, "types") {
				l.typ(t.k, t.v)
			}
		case "errors":
			for _, t := range l.mapping(p.v, "errors") {
				l.errorDecl(t.k, t.v)
			}
		case "interfaces":
			for _, t := range l.mapping(p.v, "interfaces") {
				l.iface(t.k, t.v)
			}
		case "capabilities":
			for _, t := range l.mapping(p.v, "capabilities") {
				l.capability(t.k, t.v)
			}
		case "mechanisms":
			for _, t := range l.mapping(p.v, "mechanisms") {
				l.mechanism(t.k, t.v)
			}
		case "invariants":
			for _, t := range l.mapping(p.v, "invariants") {
				l.invariant(t.k, t.v)
			}
		case "plugin_abi":
			l.pluginABI(p.v)
		case "ownership":
			l.ownership(p.v)
		}
	}
	for _, req := range specRequired["spec"] {
		if !hasKey(n, req) && n.Kind == yaml.MappingNode {
			l.e.add(l.pos(n), "spec: missing %q", req)
		}
	}
}

func (l *loader) packages(n *yaml.Node) {
	ps := &l.s.Packages
	l.s.pkgPos = map[string]pos{}
	for _, p := range l.mapping(n, "packages", specKeys["packages"]...) {
		v := l.str(p.v, "packages."+p.k.Value)
		l.s.pkgPos[p.k.Value] = l.pos(p.v)
		switch p.k.Value {
		case "contract":
			ps.Contract = v
		case "checked":
			ps.Checked = v
		case "conformance":
			ps.Conformance = v
		case "fakes":
			ps.Fakes = v
		}
	}
	for k, v := range map[string]string{"contract": ps.Contract, "checked": ps.Checked, "conformance": ps.Conformance, "fakes": ps.Fakes} {
		if v == "" && n.Kind == yaml.MappingNode && !hasKey(n, k) {
			l.e.add(l.pos(n), "packages: missing %q", k)
		}
	}
}

func (l *loader) typ(k, v *yaml.Node) {
	t := &typeDecl{Name: l.exported(k, "types"), Pos: l.pos(k)}
	what := "type " + t.Name
	for _, p := range l.mapping(v, what, specKeys["type"]...) {
		switch p.k.Value {
		case "kind":
			t.Kind = l.str(p.v, what+".kind")
			if t.Kind != "" && !contains([]string{kindScalar, kindEnum, kindStruct, KindHandle}, t.Kind) {
				l.e.add(l.pos(p.v), "%s: unknown kind %q (want scalar, enum, struct or handle)", what, t.Kind)
				t.Kind = "" // unknown: references to it are not checked against a kind
			}
		case "go":
			t.Go = l.str(p.v, what+".go")
		case "doc":
			t.Doc = l.str(p.v, what+".doc")
		case "values":
			for _, e := range l.mapping(p.v, what+".values") {
				t.Values = append(t.Values, &enumValue{Name: l.exported(e.k, what+".values"), Doc: l.str(e.v, what+".values."+e.k.Value), Pos: l.pos(e.k)})
			}
		case "fields":
			for _, f := range l.mapping(p.v, what+".fields") {
				t.Fields = append(t.Fields, &field{Name: l.exported(f.k, what+".fields"), Type: l.str(f.v, what+".fields."+f.k.Value), Pos: l.pos(f.v)})
			}
		}
	}
	if v.Kind == yaml.MappingNode && !hasKey(v, "kind") {
		l.e.add(t.Pos, "%s: missing \"kind\"", what)
	}
	if t.Doc == "" && v.Kind == yaml.MappingNode && !hasKey(v, "doc") {
		l.e.add(t.Pos, "%s: missing \"doc\"", what)
	}
	l.s.Types = append(l.s.Types, t)
}

func (l *loader) errorDecl(k, v *yaml.Node) {
	d := &errorDecl{Name: l.exported(k, "errors"), Pos: l.pos(k)}
	if !strings.HasPrefix(d.Name, "Err") {
		l.e.add(d.Pos, "errors: %q must start with Err", d.Name)
	}
	for _, p := range l.mapping(v, "error "+d.Name, specKeys["error"]...) {
		switch p.k.Value {
		case "doc":
			d.Doc = l.str(p.v, "error "+d.Name+".doc")
		case "wraps":
			if w := l.str(p.v, "error "+d.Name+".wraps"); w != "unsupported" {
				l.e.add(l.pos(p.v), "error %s: wraps must be \"unsupported\", got %q", d.Name, w)
			}
			d.Unsupported = true
		}
	}
	if d.Doc == "" {
		l.e.add(d.Pos, "error %s: missing \"doc\"", d.Name)
	}
	l.s.Errors = append(l.s.Errors, d)
}

func (l *loader) iface(k, v *yaml.Node) {
	i := &interfaceDecl{Name: l.exported(k, "interfaces"), Pos: l.pos(k)}
	what := "interface " + i.Name
	for _, p := range l.mapping(v, what, specKeys["interface"]...) {
		switch p.k.Value {
		case "role":
			i.Role = l.str(p.v, what+".role")
			if i.Role != "" && !contains([]string{roleGrant, roleAccount, roleFence, roleStream, roleContext}, i.Role) {
				l.e.add(l.pos(p.v), "%s: unknown role %q (want grant, account, fence, stream or context)", what, i.Role)
			}
		case "doc":
			i.Doc = l.str(p.v, what+".doc")
		case "methods":
			for _, m := range l.mapping(p.v, what+".methods") {
				i.Methods = append(i.Methods, l.method(i.Name, m.k, m.v, false))
			}
		}
	}
	l.s.Interfaces = append(l.s.Interfaces, i)
}

func (l *loader) capability(k, v *yaml.Node) {
	c := &capability{Name: l.exported(k, "capabilities"), Pos: l.pos(k)}
	what := "capability " + c.Name
	for _, p := range l.mapping(v, what, specKeys["capability"]...) {
		switch p.k.Value {
		case "required":
			c.Required = l.boolean(p.v, what+".required")
		case "doc":
			c.Doc = l.str(p.v, what+".doc")
		case "methods":
			for _, m := range l.mapping(p.v, what+".methods") {
				c.Methods = append(c.Methods, l.method(c.Name, m.k, m.v, true))
			}
		}
	}
	if c.Doc == "" {
		l.e.add(c.Pos, "%s: missing \"doc\"", what)
	}
	l.s.Capabilities = append(l.s.Capabilities, c)
}

func (l *loader) method(owner string, k, v *yaml.Node, capability bool) *method {
	m := &method{Owner: owner, Name: l.exported(k, owner+".methods"), Pos: l.pos(k)}
	what := owner + "." + m.Name
	keys := specKeys["interfaceMethod"]
	if capability {
		keys = specKeys["capabilityMethod"]
	}
	hasAccounting := false
	for _, p := range l.mapping(v, what, keys...) {
		switch p.k.Value {
		case "doc":
			m.Doc = l.str(p.v, what+".doc")
		case "params":
			if p.v.Kind != yaml.MappingNode {
				m.badParams = true
			}
			for _, q := range l.mapping(p.v, what+".params") {
				if !paramRE.MatchString(q.k.Value) {
					l.e.add(l.pos(q.k), "%s.params: %q is not a lower-case parameter name", what, q.k.Value)
					m.badParams = true
				}
				m.Params = append(m.Params, &param{Name: q.k.Value, Type: l.str(q.v, what+".params."+q.k.Value), Pos: l.pos(q.v), NamePos: l.pos(q.k)})
			}
		case "returns":
			ts, ps := l.strList(p.v, what+".returns")
			for i, t := range ts {
				m.Returns = append(m.Returns, &param{Type: t, Pos: ps[i]})
			}
		case "accounting":
			hasAccounting = true
			m.Accounting = l.accounting(p.v, what)
		case "creates":
			m.Creates = l.str(p.v, what+".creates")
		case "releases":
			m.Releases = l.str(p.v, what+".releases")
		case "requires":
			ts, ps := l.strList(p.v, what+".requires")
			for i, t := range ts {
				if r := l.requirement(t, ps[i], what); r != nil {
					m.Requires = append(m.Requires, r)
				}
			}
		}
	}
	if m.Doc == "" && v.Kind == yaml.MappingNode {
		l.e.add(m.Pos, "%s: missing \"doc\"", what)
	}
	if capability && !hasAccounting && v.Kind == yaml.MappingNode {
		if m.Releases != "" {
			l.e.add(m.Pos, "%s: missing \"accounting\" (a release method says what it refunds, or none)", what)
		} else {
			l.e.add(m.Pos, "%s: missing \"accounting\" (none, query, {consumes: ...} or {refunds: ...})", what)
		}
	}
	return m
}

func (l *loader) accounting(n *yaml.Node, what string) accounting {
	a := accounting{Pos: l.pos(n)}
	what += ".accounting"
	if n.Kind == yaml.ScalarNode {
		switch n.Value {
		case effectNone, effectQuery:
			a.Effect = n.Value
		default:
			l.e.add(l.pos(n), "%s: unknown effect %q (want none, query, {consumes: ...} or {refunds: ...})", what, n.Value)
		}
		return a
	}
	for _, p := range l.mapping(n, what, specKeys["accounting"]...) {
		switch p.k.Value {
		case "consumes", "refunds":
			if a.Effect != "" {
				l.e.add(l.pos(p.k), "%s: a method either consumes or refunds, not both", what)
				continue
			}
			a.Effect = p.k.Value
			a.Amount = l.expr(l.str(p.v, what+"."+p.k.Value), l.pos(p.v), what)
		case "round":
			a.Round = l.str(p.v, what+".round")
			if a.Round != "" && !contains([]string{roundNone, roundAlloc, roundGranularity}, a.Round) {
				l.e.add(l.pos(p.v), "%s: unknown rounding %q (want none, alloc or granularity)", what, a.Round)
			}
		case "from", "to":
			a.Account = l.str(p.v, what+"."+p.k.Value)
			if (p.k.Value == "from") != (a.Effect == effectConsumes) && a.Effect != "" {
				l.e.add(l.pos(p.k), "%s: %q goes with %s", what, p.k.Value, map[string]string{"from": "consumes", "to": "refunds"}[p.k.Value])
			}
		}
	}
	if a.Effect == "" && n.Kind == yaml.MappingNode {
		l.e.add(a.Pos, "%s: missing \"consumes\" or \"refunds\"", what)
	}
	if a.Round == "" {
		a.Round = roundNone
	}
	if a.Effect == effectConsumes && a.Account == "" {
		l.e.add(a.Pos, "%s: consuming method without a grant (\"from: <grant parameter>\")", what)
	}
	if a.Effect == effectRefunds && a.Account == "" {
		l.e.add(a.Pos, "%s: refunding method without an account (\"to: <account parameter>\")", what)
	}
	return a
}

var exprRE = regexp.MustCompile(`^(?:([a-z]+)\(([a-z][A-Za-z0-9]*)\)|([a-z][A-Za-z0-9]*)((?:\.[A-Z][A-Za-z0-9]*)*))$`)

func (l *loader) expr(s string, p pos, what string) *expr {
	if s == "" {
		return nil
	}
	m := exprRE.FindStringSubmatch(s)
	if m == nil {
		l.e.add(p, "%s: cannot parse expression %q (want param, param.Field or committed(param))", what, s)
		return nil
	}
	if m[1] != "" {
		if m[1] != "committed" {
			l.e.add(p, "%s: unknown function %q (want committed)", what, m[1])
			return nil
		}
		return &expr{Func: m[1], Param: m[2], Text: s, Pos: p}
	}
	e := &expr{Param: m[3], Text: s, Pos: p}
	if m[4] != "" {
		e.Path = strings.Split(m[4][1:], ".")
	}
	return e
}

var reqRE = regexp.MustCompile(`^([a-z]+)\(([^()]*)\)$`)

var predArity = map[string]int{predLive: 1, predWithin: 2, predAligned: 1, predPositive: 1, predFits: 2}

func (l *loader) requirement(s string, p pos, what string) *requirement {
	m := reqRE.FindStringSubmatch(s)
	if m == nil {
		l.e.add(p, "%s.requires: cannot parse %q (want pred(args))", what, s)
		return nil
	}
	n, ok := predArity[m[1]]
	if !ok {
		l.e.add(p, "%s.requires: unknown predicate %q (want live, within, aligned, positive or fits)", what, m[1])
		return nil
	}
	r := &requirement{Pred: m[1], Text: s, Pos: p}
	for _, a := range strings.Split(m[2], ",") {
		if e := l.expr(strings.TrimSpace(a), p, what+".requires"); e != nil {
			r.Args = append(r.Args, e)
		}
	}
	if len(r.Args) != n {
		l.e.add(p, "%s.requires: %s takes %d argument(s), got %d", what, m[1], n, len(r.Args))
		return nil
	}
	return r
}

func (l *loader) mechanism(k, v *yaml.Node) {
	m := &Mechanism{Name: k.Value, Pos: l.pos(k)}
	what := "mechanism " + m.Name
	if !idRE.MatchString(m.Name) {
		l.e.add(m.Pos, "mechanisms: %q is not a lower-case name", m.Name)
	}
	for _, p := range l.mapping(v, what, specKeys["mechanism"]...) {
		switch p.k.Value {
		case "package":
			m.Package, m.PackagePos = l.str(p.v, what+".package"), l.pos(p.v)
		case "type":
			m.Type, m.TypePos = l.str(p.v, what+".type"), l.pos(p.v)
		case "device":
			m.Device, m.DevicePos = l.str(p.v, what+".device"), l.pos(p.v)
		case "granularity":
			m.Granularity, m.GranularityPos = l.str(p.v, what+".granularity"), l.pos(p.v)
		case "doc":
			m.Doc = l.str(p.v, what+".doc")
		case "offers":
			if p.v.Kind != yaml.SequenceNode {
				l.e.add(l.pos(p.v), "%s.offers: expected a list", what)
				continue
			}
			seen := map[string]bool{}
			for _, c := range p.v.Content {
				name := l.str(c, what+".offers")
				if name == "" {
					continue // reported by str
				}
				if seen[name] {
					l.e.add(l.pos(c), "%s.offers: duplicate name %q", what, name)
					continue
				}
				seen[name] = true
				m.Offers = append(m.Offers, name)
				m.OfferPos = append(m.OfferPos, l.pos(c))
			}
		}
	}
	for _, req := range specRequired["mechanism"] {
		if v.Kind == yaml.MappingNode && !hasKey(v, req) {
			l.e.add(m.Pos, "%s: missing %q", what, req)
		}
	}
	l.s.Mechanisms = append(l.s.Mechanisms, m)
}

func (l *loader) invariant(k, v *yaml.Node) {
	iv := &invariant{ID: k.Value, Pos: l.pos(k)}
	what := "invariant " + iv.ID
	if !idRE.MatchString(iv.ID) {
		l.e.add(iv.Pos, "invariants: %q is not a kebab-case id", iv.ID)
	}
	for _, p := range l.mapping(v, what, specKeys["invariant"]...) {
		switch p.k.Value {
		case "says":
			iv.Says = l.str(p.v, what+".says")
		case "enforced_by":
			var ps []pos
			iv.EnforcedBy, ps = l.strList(p.v, what+".enforced_by")
			for i, e := range iv.EnforcedBy {
				if _, ok := enforcers[e]; !ok {
					l.e.add(ps[i], "%s.enforced_by: unknown enforcer %q (want one of %s)", what, e, strings.Join(enforcerNames(), ", "))
				}
			}
		case "applies_to":
			iv.AppliesPos = l.pos(p.v)
			iv.HasApplies = true
			for _, q := range l.mapping(p.v, what+".applies_to", specKeys["appliesTo"]...) {
				switch q.k.Value {
				case "consumes", "releases":
					if s := l.str(q.v, what+".applies_to."+q.k.Value); s != "any" {
						l.e.add(l.pos(q.v), "%s.applies_to.%s: want \"any\", got %q", what, q.k.Value, s)
					}
					if q.k.Value == "consumes" {
						iv.Applies.Consumes = true
					} else {
						iv.Applies.Releases = true
					}
				case "capabilities":
					iv.Applies.Capabilities, _ = l.strList(q.v, what+".applies_to.capabilities")
					iv.Applies.CapPos = elemPos(l, q.v)
				case "interfaces":
					iv.Applies.Interfaces, _ = l.strList(q.v, what+".applies_to.interfaces")
					iv.Applies.IfcPos = elemPos(l, q.v)
				}
			}
			if a := iv.Applies; !a.Consumes && !a.Releases && len(a.Capabilities) == 0 && len(a.Interfaces) == 0 {
				l.e.add(iv.AppliesPos, "%s: names nothing (applies_to is empty)", what)
			}
		}
	}
	if iv.Says == "" {
		l.e.add(iv.Pos, "%s: missing \"says\"", what)
	}
	if len(iv.EnforcedBy) == 0 {
		l.e.add(iv.Pos, "%s: missing \"enforced_by\"", what)
	}
	if !iv.HasApplies {
		l.e.add(iv.Pos, "%s: names nothing (missing \"applies_to\")", what)
	}
	l.s.Invariants = append(l.s.Invariants, iv)
}

func elemPos(l *loader, n *yaml.Node) []pos {
	var ps []pos
	for _, c := range n.Content {
		ps = append(ps, l.pos(c))
	}
	return ps
}

func hasKey(n *yaml.Node, k string) bool {
	if n.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == k {
			return true
		}
	}
	return false
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}
