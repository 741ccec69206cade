package gen

import "fmt"

// pos is a position in the spec file, 1-based as editors show it.
type pos struct {
	File      string
	Line, Col int
}

func (p pos) String() string { return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col) }

// Spec is the validated model of spec/capabilities.yaml. Every slice keeps the
// order of the file, so output is deterministic and reads like the spec.
type Spec struct {
	File     string // path as given to Load, used in positions
	Digest   string // hex sha256 of the spec's bytes: the generated tripwire
	Version  int
	Packages packages

	Types        []*typeDecl
	Errors       []*errorDecl
	Interfaces   []*interfaceDecl
	Capabilities []*capability
	Mechanisms   []*Mechanism
	Invariants   []*invariant
	PluginABI    *pluginABI // nil without a plugin_abi block
	Ownership    ownership

	types map[string]*typeDecl
	ifcs  map[string]*interfaceDecl
	caps  map[string]*capability

	// loaded says, per top-level section present, whether it was a mapping;
	// validate checks references only against sections that loaded.
	loaded map[string]bool
	pkgPos map[string]pos // packages.<key> value positions
}

// packages are the module-relative directories the generator writes.
type packages struct {
	Contract, Checked, Conformance, Fakes string
}

// Type kinds.
const (
	kindScalar = "scalar"
	kindEnum   = "enum"
	kindStruct = "struct"
	KindHandle = "handle"
)

// typeDecl is a declared value type.
type typeDecl struct {
	Name, Kind, Go, Doc string
	Values              []*enumValue // enum
	Fields              []*field     // struct, handle
	Pos                 pos
}

// enumValue is one value of an enum, numbered from 1 in spec order (0 is invalid).
type enumValue struct {
	Name, Doc string
	Pos       pos
}

// field is a struct or handle field.
type field struct {
	Name, Type string
	Pos        pos
}

// errorDecl is a sentinel error.
type errorDecl struct {
	Name, Doc   string
	Unsupported bool // wraps errors.ErrUnsupported
	Pos         pos
}

// Interface roles: the parts of the ledger and device-context contract that
// the generated code relies on by role rather than by name.
const (
	roleGrant   = "grant"
	roleAccount = "account"
	roleFence   = "fence"
	roleStream  = "stream"
	roleContext = "context"
)

// interfaceDecl is a plain interface of the contract (ledger, device context).
type interfaceDecl struct {
	Name, Role, Doc string
	Methods         []*method
	Pos             pos
}

// capability is a mechanism capability.
type capability struct {
	Name, Doc string
	Required  bool
	Methods   []*method
	Pos       pos
}

// method is a method of an interface or capability.
type method struct {
	Owner      string
	Name, Doc  string
	Params     []*param
	Returns    []*param // Name empty
	Accounting accounting
	Creates    string // handle type created (returned)
	Releases   string // param name of the handle released
	Requires   []*requirement
	Pos        pos

	// badParams is set when the parameters did not load cleanly; references
	// to parameters are then not checked (they were reported already).
	badParams bool
}

// param is a named, typed parameter. Pos is the position of its type,
// NamePos of its name.
type param struct {
	Name, Type string
	Pos        pos
	NamePos    pos
}

// Accounting effects.
const (
	effectNone     = "none"
	effectQuery    = "query"
	effectConsumes = "consumes"
	effectRefunds  = "refunds"
)

// Rounding units.
const (
	roundNone        = "none"
	roundAlloc       = "alloc"
	roundGranularity = "granularity"
)

// accounting is a method's effect on the ledger.
type accounting struct {
	Effect  string
	Amount  *expr  // consumes/refunds
	Round   string // consumes/refunds
	Account string // param: grant (consumes) or account (refunds)
	Pos     pos
}

// expr is `param`, `param.Field[.Field]` or `committed(param)`.
type expr struct {
	Func  string // "" or "committed"
	Param string
	Path  []string
	Text  string
	Pos   pos
}

// Predicates of requires clauses.
const (
	predLive     = "live"
	predWithin   = "within"
	predAligned  = "aligned"
	predPositive = "positive"
	predFits     = "fits"
)

// requirement is a precondition the checked wrapper enforces.
type requirement struct {
	Pred string
	Args []*expr
	Text string
	Pos  pos
}

// Mechanism is a declared implementation. Package is a module-relative
// directory; its last element is the Go package name.
type Mechanism struct {
	Name, Package, Type, Device, Granularity, Doc string
	Offers                                        []string
	OfferPos                                      []pos
	Pos                                           pos
	PackagePos, TypePos, DevicePos                pos
	GranularityPos                                pos
}

// invariant is a rule of the spec's invariants section: what it says, where
// it is enforced and what it applies to.
type invariant struct {
	ID, Says   string
	EnforcedBy []string
	Applies    applies
	AppliesPos pos
	HasApplies bool
	Pos        pos
}

// applies says what an invariant governs; at least one part is non-empty.
type applies struct {
	Consumes, Releases bool
	Capabilities       []string
	Interfaces         []string
	CapPos, IfcPos     []pos
}

// Type returns the declared type named n, or nil.
func (s *Spec) Type(n string) *typeDecl { return s.types[n] }

// interfaceNamed returns the declared interface named n, or nil.
func (s *Spec) interfaceNamed(n string) *interfaceDecl { return s.ifcs[n] }

// capability returns the declared capability named n, or nil.
func (s *Spec) Capability(n string) *capability { return s.caps[n] }

// roleInterface returns the interface declared with role r.
func (s *Spec) roleInterface(r string) *interfaceDecl {
	for _, i := range s.Interfaces {
		if i.Role == r {
			return i
		}
	}
	return nil
}

// handles returns the handle types in spec order.
func (s *Spec) handles() []*typeDecl {
	var hs []*typeDecl
	for _, t := range s.Types {
		if t.Kind == KindHandle {
			hs = append(hs, t)
		}
	}
	return hs
}

// param returns the parameter named n, or nil.
func (m *method) Param(n string) *param {
	for _, p := range m.Params {
		if p.Name == n {
			return p
		}
	}
	return nil
}

// ReturnsError reports whether the method's last result is an error.
func (m *method) ReturnsError() bool {
	return len(m.Returns) > 0 && m.Returns[len(m.Returns)-1].Type == "error"
}

// builtins maps the spec's built-in type names to Go.
var builtins = map[string]bool{
	"context.Context": true,
	"[]byte":          true,
	"<-chan struct{}": true,
	"error":           true,
	"bool":            true,
	"int":             true,
	"string":          true,
	"uint64":          true,
}
