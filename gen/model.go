package gen

import "fmt"

// Pos is a position in the spec file, 1-based as editors show it.
type Pos struct {
	File      string
	Line, Col int
}

func (p Pos) String() string { return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col) }

// Spec is the validated model of spec/capabilities.yaml. Every slice keeps the
// order of the file, so output is deterministic and reads like the spec.
type Spec struct {
	File     string // path as given to Load, used in positions
	Digest   string // hex sha256 of the spec's bytes: the generated tripwire
	Version  int
	Packages Packages

	Types        []*TypeDecl
	Errors       []*ErrorDecl
	Interfaces   []*InterfaceDecl
	Capabilities []*Capability
	Mechanisms   []*Mechanism
	Invariants   []*Invariant
	PluginABI    *PluginABI // nil without a plugin_abi block
	Ownership    Ownership

	types map[string]*TypeDecl
	ifcs  map[string]*InterfaceDecl
	caps  map[string]*Capability

	// loaded says, per top-level section present, whether it was a mapping;
	// validate checks references only against sections that loaded.
	loaded map[string]bool
	pkgPos map[string]Pos // packages.<key> value positions
}

// Packages are the module-relative directories the generator writes.
type Packages struct {
	Contract, Checked, Conformance, Fakes string
}

// Type kinds.
const (
	KindScalar = "scalar"
	KindEnum   = "enum"
	KindStruct = "struct"
	KindHandle = "handle"
)

// TypeDecl is a declared value type.
type TypeDecl struct {
	Name, Kind, Go, Doc string
	Values              []*EnumValue // enum
	Fields              []*Field     // struct, handle
	Pos                 Pos
}

// EnumValue is one value of an enum, numbered from 1 in spec order (0 is invalid).
type EnumValue struct {
	Name, Doc string
	Pos       Pos
}

// Field is a struct or handle field.
type Field struct {
	Name, Type string
	Pos        Pos
}

// ErrorDecl is a sentinel error.
type ErrorDecl struct {
	Name, Doc   string
	Unsupported bool // wraps errors.ErrUnsupported
	Pos         Pos
}

// Interface roles: the parts of the ledger and device-context contract that
// the generated code relies on by role rather than by name.
const (
	RoleGrant   = "grant"
	RoleAccount = "account"
	RoleFence   = "fence"
	RoleStream  = "stream"
	RoleContext = "context"
)

// InterfaceDecl is a plain interface of the contract (ledger, device context).
type InterfaceDecl struct {
	Name, Role, Doc string
	Methods         []*Method
	Pos             Pos
}

// Capability is a mechanism capability.
type Capability struct {
	Name, Doc string
	Required  bool
	Methods   []*Method
	Pos       Pos
}

// Method is a method of an interface or capability.
type Method struct {
	Owner      string
	Name, Doc  string
	Params     []*Param
	Returns    []*Param // Name empty
	Accounting Accounting
	Creates    string // handle type created (returned)
	Releases   string // param name of the handle released
	Requires   []*Requirement
	Pos        Pos

	// badParams is set when the parameters did not load cleanly; references
	// to parameters are then not checked (they were reported already).
	badParams bool
}

// Param is a named, typed parameter. Pos is the position of its type,
// NamePos of its name.
type Param struct {
	Name, Type string
	Pos        Pos
	NamePos    Pos
}

// Accounting effects.
const (
	EffectNone     = "none"
	EffectQuery    = "query"
	EffectConsumes = "consumes"
	EffectRefunds  = "refunds"
)

// Rounding units.
const (
	RoundNone        = "none"
	RoundAlloc       = "alloc"
	RoundGranularity = "granularity"
)

// Accounting is a method's effect on the ledger.
type Accounting struct {
	Effect  string
	Amount  *Expr  // consumes/refunds
	Round   string // consumes/refunds
	Account string // param: grant (consumes) or account (refunds)
	Pos     Pos
}

// Expr is `param`, `param.Field[.Field]` or `committed(param)`.
type Expr struct {
	Func  string // "" or "committed"
	Param string
	Path  []string
	Text  string
	Pos   Pos
}

// Predicates of requires clauses.
const (
	PredLive     = "live"
	PredWithin   = "within"
	PredAligned  = "aligned"
	PredPositive = "positive"
	PredFits     = "fits"
)

// Requirement is a precondition the checked wrapper enforces.
type Requirement struct {
	Pred string
	Args []*Expr
	Text string
	Pos  Pos
}

// Mechanism is a declared implementation. Package is a module-relative
// directory; its last element is the Go package name.
type Mechanism struct {
	Name, Package, Type, Device, Granularity, Doc string
	Offers                                        []string
	OfferPos                                      []Pos
	Pos                                           Pos
	PackagePos, TypePos, DevicePos                Pos
	GranularityPos                                Pos
}

// Invariant is a rule of the spec's invariants section: what it says, where
// it is enforced and what it applies to.
type Invariant struct {
	ID, Says   string
	EnforcedBy []string
	Applies    Applies
	AppliesPos Pos
	HasApplies bool
	Pos        Pos
}

// Applies says what an invariant governs; at least one part is non-empty.
type Applies struct {
	Consumes, Releases bool
	Capabilities       []string
	Interfaces         []string
	CapPos, IfcPos     []Pos
}

// Type returns the declared type named n, or nil.
func (s *Spec) Type(n string) *TypeDecl { return s.types[n] }

// Interface returns the declared interface named n, or nil.
func (s *Spec) Interface(n string) *InterfaceDecl { return s.ifcs[n] }

// Capability returns the declared capability named n, or nil.
func (s *Spec) Capability(n string) *Capability { return s.caps[n] }

// RoleInterface returns the interface declared with role r.
func (s *Spec) RoleInterface(r string) *InterfaceDecl {
	for _, i := range s.Interfaces {
		if i.Role == r {
			return i
		}
	}
	return nil
}

// Handles returns the handle types in spec order.
func (s *Spec) Handles() []*TypeDecl {
	var hs []*TypeDecl
	for _, t := range s.Types {
		if t.Kind == KindHandle {
			hs = append(hs, t)
		}
	}
	return hs
}

// Param returns the parameter named n, or nil.
func (m *Method) Param(n string) *Param {
	for _, p := range m.Params {
		if p.Name == n {
			return p
		}
	}
	return nil
}

// ReturnsError reports whether the method's last result is an error.
func (m *Method) ReturnsError() bool {
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
