package gen

import (
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// pluginABI is the spec's plugin_abi block: the version of the plugin C ABI
// as data, where its header and loader live, how slots were added by each
// minor, and the plugin mechanisms the spec declares. It is nil when the spec
// has no such block, and then nothing of the C ABI is generated.
type pluginABI struct {
	Major, Minor int
	Header       string // module-relative path of the generated C header
	Loader       string // module-relative package of the Go loader
	Prefix       string // C identifier prefix, e.g. memgen
	Reserved     int    // reserved pointer slots at the end of the descriptor
	Minors       []*abiMinor
	Plugins      []*pluginDecl
	Limits       []*slotLimit // per slot: align, size limits and the status of every violation
	Pos          pos
}

// slotLimit is what the header states beside one capability slot, from
// plugin_abi.limits: what the host checks before the call, the limits on its
// arguments and the status the plugin returns for each violation it must
// detect itself.
type slotLimit struct {
	Slot string // Capability.Method
	Text string
	Pos  pos
}

// LimitOf returns the limits text of method m's slot, or "".
func (a *pluginABI) LimitOf(m *method) string {
	for _, l := range a.Limits {
		if l.Slot == m.Owner+"."+m.Name {
			return l.Text
		}
	}
	return ""
}

// abiMinor lists the slots one minor version appended, as Capability.Method.
type abiMinor struct {
	Minor    int
	Slots    []string
	SlotPos  []pos
	Pos      pos
	byMethod map[string]bool
}

// pluginDecl declares a plugin mechanism: a shared library, loaded through the
// loader package, whose descriptor must carry this name and device.
type pluginDecl struct {
	Name, Device, Doc string
	Offers            []string
	OfferPos          []pos
	Pos               pos
}

// SlotSince returns the minor that added method m's slot (0 for the slots of
// the first minor).
func (a *pluginABI) SlotSince(m *method) int {
	for _, mi := range a.Minors {
		if mi.byMethod[m.Owner+"."+m.Name] {
			return mi.Minor
		}
	}
	return 0
}

func init() {
	specKeys["spec"] = append(specKeys["spec"], "plugin_abi")
	specKeys["pluginABI"] = []string{"major", "minor", "header", "loader", "prefix", "reserved", "minors", "plugins", "limits"}
	specRequired["pluginABI"] = []string{"major", "minor", "header", "loader", "prefix"}
	specKeys["plugin"] = []string{"device", "offers", "doc"}
	specRequired["plugin"] = []string{"device", "offers", "doc"}
}

func (l *loader) integer(n *yaml.Node, what string, min int) int {
	v, err := strconv.Atoi(n.Value)
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || err != nil || v < min {
		l.e.add(l.pos(n), "%s: expected an integer of at least %d", what, min)
		return min
	}
	return v
}

// pluginABI reads the plugin_abi block.
func (l *loader) pluginABI(n *yaml.Node) {
	a := &pluginABI{Pos: l.pos(n)}
	const what = "plugin_abi"
	for _, p := range l.mapping(n, what, specKeys["pluginABI"]...) {
		switch p.k.Value {
		case "major":
			a.Major = l.integer(p.v, what+".major", 1)
		case "minor":
			a.Minor = l.integer(p.v, what+".minor", 0)
		case "header":
			a.Header = l.str(p.v, what+".header")
			if a.Header != "" && !strings.HasSuffix(a.Header, ".h") {
				l.e.add(l.pos(p.v), "%s.header: %q is not a .h file", what, a.Header)
			}
		case "loader":
			a.Loader = l.str(p.v, what+".loader")
		case "prefix":
			a.Prefix = l.str(p.v, what+".prefix")
			if a.Prefix != "" && !idRE.MatchString(a.Prefix) || strings.Contains(a.Prefix, "-") {
				l.e.add(l.pos(p.v), "%s.prefix: %q is not a lower-case C identifier", what, a.Prefix)
			}
		case "reserved":
			a.Reserved = l.integer(p.v, what+".reserved", 0)
		case "minors":
			for _, m := range l.mapping(p.v, what+".minors") {
				n, err := strconv.Atoi(m.k.Value)
				if err != nil || n < 1 {
					l.e.add(l.pos(m.k), "%s.minors: %q is not a minor version of at least 1", what, m.k.Value)
				}
				mi := &abiMinor{Minor: n, Pos: l.pos(m.k), byMethod: map[string]bool{}}
				mi.Slots, mi.SlotPos = l.strList(m.v, what+".minors."+m.k.Value)
				for _, s := range mi.Slots {
					mi.byMethod[s] = true
				}
				a.Minors = append(a.Minors, mi)
			}
		case "plugins":
			for _, q := range l.mapping(p.v, what+".plugins") {
				a.Plugins = append(a.Plugins, l.plugin(q.k, q.v))
			}
		case "limits":
			for _, q := range l.mapping(p.v, what+".limits") {
				a.Limits = append(a.Limits, &slotLimit{Slot: q.k.Value, Text: l.str(q.v, what+".limits."+q.k.Value), Pos: l.pos(q.k)})
			}
		}
	}
	for _, req := range specRequired["pluginABI"] {
		if n.Kind == yaml.MappingNode && !hasKey(n, req) {
			l.e.add(a.Pos, "%s: missing %q", what, req)
		}
	}
	l.s.PluginABI = a
}

func (l *loader) plugin(k, v *yaml.Node) *pluginDecl {
	d := &pluginDecl{Name: k.Value, Pos: l.pos(k)}
	what := "plugin " + d.Name
	if !idRE.MatchString(d.Name) {
		l.e.add(d.Pos, "plugin_abi.plugins: %q is not a lower-case name", d.Name)
	}
	for _, p := range l.mapping(v, what, specKeys["plugin"]...) {
		switch p.k.Value {
		case "device":
			d.Device = l.str(p.v, what+".device")
		case "doc":
			d.Doc = l.str(p.v, what+".doc")
		case "offers":
			d.Offers, d.OfferPos = l.strList(p.v, what+".offers")
		}
	}
	for _, req := range specRequired["plugin"] {
		if v.Kind == yaml.MappingNode && !hasKey(v, req) {
			l.e.add(d.Pos, "%s: missing %q", what, req)
		}
	}
	return d
}

// validatePluginABI checks the cross-references of the plugin_abi block: the
// minors are 1..minor in order, each slot names a capability method once,
// every plugin's device is a DeviceKind value and its offers are declared
// capabilities including the required ones.
func validatePluginABI(s *Spec, e *errs) {
	a := s.PluginABI
	if a == nil {
		return
	}
	seen := map[string]bool{}
	for i, mi := range a.Minors {
		if mi.Minor != i+1 || mi.Minor > a.Minor {
			e.add(mi.Pos, "plugin_abi.minors: minor %d out of order (want 1..%d, ascending)", mi.Minor, a.Minor)
		}
		for j, sl := range mi.Slots {
			c, m, _ := strings.Cut(sl, ".")
			cp := s.Capability(c)
			found := false
			if cp != nil {
				for _, mm := range cp.Methods {
					found = found || mm.Name == m
				}
			}
			switch {
			case !found:
				e.add(mi.SlotPos[j], "plugin_abi.minors: %q is not a Capability.Method of the spec", sl)
			case seen[sl]:
				e.add(mi.SlotPos[j], "plugin_abi.minors: slot %q added twice", sl)
			}
			seen[sl] = true
		}
	}
	for _, lim := range a.Limits {
		c, m, _ := strings.Cut(lim.Slot, ".")
		found := false
		if cp := s.Capability(c); cp != nil {
			for _, mm := range cp.Methods {
				found = found || mm.Name == m
			}
		}
		if !found {
			e.add(lim.Pos, "plugin_abi.limits: %q is not a Capability.Method of the spec", lim.Slot)
		}
	}
	names := map[string]bool{}
	for _, p := range a.Plugins {
		if names[p.Name] {
			e.add(p.Pos, "plugin_abi.plugins: duplicate name %q", p.Name)
		}
		names[p.Name] = true
		if dk := s.types["DeviceKind"]; dk != nil && p.Device != "" && !dk.hasValue(p.Device) {
			e.add(p.Pos, "plugin %s: device %q is not a DeviceKind value", p.Name, p.Device)
		}
		offered := map[string]bool{}
		for i, o := range p.Offers {
			if s.Capability(o) == nil {
				e.add(p.OfferPos[i], "plugin %s: offers undeclared capability %q", p.Name, o)
			}
			offered[o] = true
		}
		for _, c := range s.Capabilities {
			if c.Required && !offered[c.Name] && len(p.Offers) > 0 {
				e.add(p.Pos, "plugin %s: must offer required capability %s", p.Name, c.Name)
			}
		}
	}
}
