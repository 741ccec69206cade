package gen

import (
	"fmt"
	"path"
	"strings"

	. "github.com/dave/jennifer/jen"
)

// cabiEmitter writes the plugin C ABI: the C header and the loader's Go
// mirrors of it.
var cabiEmitter = &emitter{Name: "cabi", Requires: []*emitter{contractEmitter}, Emit: noResult(emitCABI)}

func init() { register(cabiEmitter) }

// emitCABI writes the plugin C ABI when the spec has a plugin_abi block: the
// C header (include/memgen/mechanism.h) and, in the loader package, the Go
// mirrors of its structs with the status table and the declared plugins
// (zz_generated.abi.go) and the layout table its tests compare with what a C
// compiler reports (zz_generated.layout_test.go).
func emitCABI(g *generator) error {
	if g.Spec.PluginABI == nil {
		return nil
	}
	c, err := newCAbi(g)
	if err != nil {
		return err
	}
	g.Raw(g.Spec.PluginABI.Header, []byte(c.header()))
	c.goMirrors()
	c.goLayoutTable()
	return nil
}

// statusConst is the C name of a spec error's status code.
func (c *cAbi) statusConst(e *errorDecl) string {
	return c.P + "_ERR_" + strings.ToUpper(cSnake(strings.TrimPrefix(e.Name, "Err")))
}

// cComment writes text as a C block comment indented by ind, wrapped at 78.
func cComment(b *strings.Builder, ind string, text string) {
	var lines []string
	for _, para := range strings.Split(strings.TrimSpace(text), "\n\n") {
		if len(lines) > 0 {
			lines = append(lines, "")
		}
		line := ""
		for _, w := range strings.Fields(para) {
			if line != "" && len(ind)+3+len(line)+1+len(w) > 78 {
				lines = append(lines, line)
				line = ""
			}
			if line != "" {
				line += " "
			}
			line += w
		}
		if line != "" {
			lines = append(lines, line)
		}
	}
	b.WriteString(ind + "/*\n")
	for _, l := range lines {
		if l == "" {
			b.WriteString(ind + " *\n")
		} else {
			b.WriteString(ind + " * " + l + "\n")
		}
	}
	b.WriteString(ind + " */\n")
}

func (c *cAbi) header() string {
	a, P, p := c.a, c.P, c.p
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	guard := P + "_" + strings.ToUpper(strings.NewReplacer("/", "_", ".", "_").Replace(path.Base(a.Header)))
	w("%s\n\n", c.g.header(""))
	cComment(&b, "", fmt.Sprintf(`%s: the memgen plugin C ABI, version %d.%d, generated from the plugin_abi block of spec/capabilities.yaml. docs/cabi.md explains how to write a plugin and check it with memgen plugin-check.

A plugin is a shared library exporting %s_plugin_v%d. The host (the Go loader, package %s) loads it by path at run time, calls the entry point with its own %s_ABI_VERSION and gets a descriptor: the plugin's name, device and default granularities, open/close for instances, last_error, and one struct of function pointers (slots) per capability. A NULL struct or a NULL slot means absent: the host never calls it, and a capability with any slot absent is absent as a whole. A present slot must do its work; returning %s_OK without doing it is a contract violation the host's checks report.

Versioning. Every struct of slots starts with uint32_t struct_size and uint32_t abi_version (major << 16 | minor). A minor only appends slots at the end of a struct (or carves a descriptor member out of reserved); the host reads no slot at or past struct_size and none newer than the plugin's minor, so older plugins load with fewer capabilities and newer plugins load with their extra slots ignored. Anything else is a new major, and a host refuses a plugin of another major.

Accounting. Plugins never see grants or accounts: the host draws from its grant before every consuming call and undraws when the call fails, and refunds after every releasing call that succeeded. A plugin reports failure only when it changed nothing. used_bytes is the sum over the instance's live objects: an allocation's size, a reservation's committed bytes, a backing's size (once, however many views map it; a copy_on_write copy is a new backing and counts at its size); reservations and views add nothing themselves.

Handles are ids the host owns. Before a slot that creates a handle the host writes a fresh id into out->id (nonzero, never used before in the process); the plugin files the new object under it and leaves it unchanged. Every id the host passes later is one it assigned and still holds live for this instance; a plugin that answers %s_ERR_RELEASED for such an id, or changes out->id, breaks the protocol: the host fails the call with a protocol error and keeps the bytes behind the id accounted (quarantined) until the instance closes. Streams and fences are not handles: they hold no accounted memory, and their ids are the plugin's own (nonzero), passed back unchanged.

Deadlines. A slot that consumes memory receives deadline_ns, an absolute CLOCK_MONOTONIC time in nanoseconds (0: none). A slot that cannot finish by then undoes what it did and returns %s_ERR_UNAVAILABLE. The host cannot preempt a C slot: one that returns past its deadline has its result given back (a copy_on_write's is kept, since the view it replaced is gone), and the call fails with an overrun error the host also counts and logs.

Thread safety: every slot may be called from any thread, concurrently with any other slot of the same or another instance; the plugin synchronizes its own state (the host's checks include a concurrent stress). No slot may call back into the host, keep a pointer it was passed beyond the call, or block without bound. A fault inside a slot (a write past an out struct, a touch of memory the plugin never mapped, abort) cannot be contained by the host's process: it ends it.`,
		a.Header, a.Major, a.Minor, p, a.Major, a.Loader, P, P, P, P))
	w("#ifndef %s\n#define %s\n\n#include <stddef.h>\n#include <stdint.h>\n\n", guard, guard)
	w("#ifdef __cplusplus\nextern \"C\" {\n#define %s_STATIC_ASSERT(c, m) static_assert(c, m)\n#else\n#define %s_STATIC_ASSERT(c, m) _Static_assert(c, m)\n#endif\n\n", P, P)
	w("#if defined(__GNUC__)\n#define %s_EXPORT __attribute__((visibility(\"default\")))\n#else\n#define %s_EXPORT\n#endif\n\n", P, P)
	cComment(&b, "", "The ABI version this header declares, and how a version packs into 32 bits.")
	w("#define %s_ABI_MAJOR %du\n#define %s_ABI_MINOR %du\n", P, a.Major, P, a.Minor)
	w("#define %s_ABI_VERSION_OF(major, minor) (((uint32_t)(major) << 16) | (uint32_t)(minor))\n", P)
	w("#define %s_ABI_VERSION %s_ABI_VERSION_OF(%s_ABI_MAJOR, %s_ABI_MINOR)\n", P, P, P, P)
	w("#define %s_ABI_MAJOR_OF(v) ((uint32_t)(v) >> 16)\n#define %s_ABI_MINOR_OF(v) ((uint32_t)(v) & 0xffffu)\n", P, P)
	w("#define %s_PLUGIN_ENTRY \"%s_plugin_v%d\"\n\n", P, p, a.Major)
	w("%s_STATIC_ASSERT(sizeof(void *) == 8, \"the memgen plugin ABI is defined for 64-bit platforms\");\n\n", P)

	for _, t := range c.g.Spec.Types {
		if t.Kind == kindScalar && t.Go == "uint64" {
			cComment(&b, "", docComment(t.Name, t.Doc))
			w("typedef uint64_t %s_%s;\n\n", p, cSnake(t.Name))
		}
	}
	cComment(&b, "", "A handle's id: assigned by the host, nonzero, never reused in the process. 0 is never a handle.")
	w("typedef uint64_t %s_handle;\n\n", p)

	cComment(&b, "", "A status: "+P+"_OK, or the code of one of the spec's errors, numbered in spec order. Pinned to 32 bits. A plugin returns only codes this header declares; the host reports any other value as a protocol violation.")
	w("typedef int32_t %s_status;\nenum %s_status_code {\n", p, p)
	w("  %s_OK = 0,\n", P)
	for i, e := range c.g.Spec.Errors {
		cComment(&b, "  ", e.Doc)
		w("  %s = %d,\n", c.statusConst(e), i+1)
	}
	w("  %s_STATUS_MAX_ = 0x7fffffff\n};\n", P)
	w("%s_STATIC_ASSERT(sizeof(enum %s_status_code) == 4, \"status codes are 32 bits\");\n\n", P, p)
	for _, t := range c.g.Spec.Types {
		if t.Kind != kindEnum {
			continue
		}
		n := p + "_" + cSnake(t.Name)
		N := strings.ToUpper(n)
		cComment(&b, "", docComment(t.Name, t.Doc)+" Pinned to 32 bits; 0 is invalid.")
		w("typedef int32_t %s;\nenum %s_value {\n", n, n)
		for i, v := range t.Values {
			cComment(&b, "  ", v.Doc)
			w("  %s_%s = %d,\n", N, strings.ToUpper(cSnake(v.Name)), i+1)
		}
		w("  %s_MAX_ = 0x7fffffff\n};\n", N)
		w("%s_STATIC_ASSERT(sizeof(enum %s_value) == 4, \"enums are 32 bits\");\n\n", P, n)
	}
	for _, s := range c.data {
		c.cStructDecl(&b, s)
	}
	for _, s := range c.vtables {
		c.cStructDecl(&b, s)
	}
	c.cStructDecl(&b, c.desc)
	cComment(&b, "", fmt.Sprintf("The entry point every plugin exports (%s_PLUGIN_ENTRY). host_abi_version is the host's %s_ABI_VERSION. It returns the plugin's descriptor, or NULL when the plugin cannot serve this host; it may be called more than once and from any thread, and returns the same descriptor each time.", P, P))
	w("typedef const %s_plugin *(*%s_plugin_entry)(uint32_t host_abi_version);\n", p, p)
	w("%s_EXPORT const %s_plugin *%s_plugin_v%d(uint32_t host_abi_version);\n\n", P, p, p, a.Major)
	for _, s := range append(append(append([]*cStruct{}, c.data...), c.vtables...), c.desc) {
		w("%s_STATIC_ASSERT(sizeof(%s) == %d, \"%s layout\");\n", P, s.C, s.Size, s.C)
		for _, f := range s.Fields {
			w("%s_STATIC_ASSERT(offsetof(%s, %s) == %d, \"%s.%s offset\");\n", P, s.C, f.C, f.Off, s.C, f.C)
		}
	}
	w("\n#ifdef __cplusplus\n} /* extern \"C\" */\n#endif\n\n#endif /* %s */\n", guard)
	return b.String()
}

// cStructDecl writes one struct typedef with its members' docs.
func (c *cAbi) cStructDecl(b *strings.Builder, s *cStruct) {
	doc := s.Doc
	if s.VTable {
		doc += fmt.Sprintf("\n\nSize %d bytes at this minor; members are only ever appended.", s.Size)
	}
	cComment(b, "", doc)
	fmt.Fprintf(b, "typedef struct %s {\n", s.C)
	for _, f := range s.Fields {
		d := f.Doc
		if m := c.slotOf[f]; m != nil {
			d = c.slotDoc(m)
		} else if m := c.ctxDocs[f.C]; m != nil {
			d = c.contextDoc(f.C, m)
		} else if f.Fn && f.C == "fence_release" {
			d += "\n\nThread safety: any thread. The plugin must not release a fence while its stream still needs it."
		}
		if f.Since > 0 {
			d += fmt.Sprintf("\n\nSince ABI %d.%d.", c.a.Major, f.Since)
		}
		if d != "" {
			cComment(b, "  ", d)
		}
		switch {
		case f.Fn:
			fmt.Fprintf(b, "  "+f.CType+";\n", f.C)
		case f.Array > 0:
			fmt.Fprintf(b, "  %s%s[%d];\n", spaced(f.CType), f.C, f.Array)
		default:
			fmt.Fprintf(b, "  %s%s;\n", spaced(f.CType), f.C)
		}
	}
	fmt.Fprintf(b, "} %s;\n\n", s.C)
}

// spaced appends a space to a C type unless it ends in '*'.
func spaced(t string) string {
	if strings.HasSuffix(t, "*") {
		return t
	}
	return t + " "
}

// slotDoc is a capability slot's contract: the spec's doc, then what the
// host does around the call, ownership, and what the plugin may not do.
func (c *cAbi) slotDoc(m *method) string {
	var parts []string
	parts = append(parts, m.Doc)
	acc := m.Accounting
	round := map[string]string{roundNone: "", roundAlloc: " rounded up to alloc_granularity", roundGranularity: " rounded up to granularity"}[acc.Round]
	switch acc.Effect {
	case effectConsumes:
		parts = append(parts, fmt.Sprintf("Accounting (host side): before the call the host draws %s%s from its grant, and undraws it if the slot fails. On %s_OK the plugin must have installed exactly that much; the checked wrapper verifies it.", acc.Amount.Text, round, c.P))
		parts = append(parts, fmt.Sprintf("Deadline: deadline_ns (CLOCK_MONOTONIC ns, 0: none). Past it, undo and return %s_ERR_UNAVAILABLE; a slot that returns late anyway has its result given back by the host (copy_on_write: kept and reported).", c.P))
	case effectRefunds:
		amount := acc.Amount.Text
		if acc.Amount.Func == "committed" {
			amount = "the bytes still committed in " + acc.Amount.Param
		}
		parts = append(parts, fmt.Sprintf("Accounting (host side): after %s_OK the host refunds %s%s. On failure nothing is refunded, so the plugin fails only when it released nothing.", c.P, amount, round))
	case effectQuery:
		parts = append(parts, "A query: it changes nothing and must not block on device work.")
	default:
		parts = append(parts, "Accounting: none; address space only.")
	}
	var own []string
	if m.Creates != "" {
		rel := c.releaserOf(m.Creates)
		own = append(own, fmt.Sprintf("out->id holds the id the host assigned to the new %s: the plugin files it under that id, leaves out->id unchanged and fills the other members on %s_OK. The id is the host's until it passes it to %s.", m.Creates, c.P, rel))
	}
	if m.Releases != "" {
		kind := m.Releases
		if p := m.Param(m.Releases); p != nil {
			kind = p.Type
		}
		own = append(own, fmt.Sprintf("The host passes each %s id (%s) here at most once; after %s_OK the id is dead and the plugin may reuse it.", kind, cSnake(m.Releases), c.P))
	}
	own = append(own, "Handle ids passed in are live ids of this instance (the host checked): answering "+c.P+"_ERR_RELEASED for one is a protocol error. Pointers passed in are borrowed for the call only.")
	parts = append(parts, "Ownership: "+strings.Join(own, " "))
	parts = append(parts, "Thread safety: any thread, concurrently with every other slot; the plugin serializes what must be.")
	var errs []string
	for _, e := range c.g.Spec.Errors {
		if strings.Contains(m.Doc, e.Name) {
			errs = append(errs, c.statusConst(e))
		}
	}
	if len(errs) > 0 {
		parts = append(parts, "Errors named above: "+strings.Join(errs, ", ")+".")
	}
	if lim := c.a.LimitOf(m); lim != "" {
		parts = append(parts, "Limits and statuses: "+lim)
	}
	parts = append(parts, "The plugin must not: call back into the host, report success for work it did not do, or return a status this header does not declare.")
	return strings.Join(parts, "\n\n")
}

// contextDoc is a device-context slot's contract.
func (c *cAbi) contextDoc(name string, m *method) string {
	parts := []string{m.Doc}
	switch {
	case name == "stream_create":
		parts = append(parts, "On "+c.P+"_OK *out_stream is the plugin's new stream id; the host passes it to stream_close exactly once.")
	case name == "stream_close":
		parts = []string{"stream_close waits for the stream's enqueued work and releases the stream. The host calls it exactly once per stream (Stream.Close's idempotence is the host's), after which the id is dead."}
	case name == "stream_record":
		parts = append(parts, "On "+c.P+"_OK *out_fence is a new fence id; the host releases it with fence_release.")
	case name == "fence_done":
		parts = append(parts, "Writes 1 to *out_done once the fence completed (and 0 before), and then returns the first error of the work the fence covers. The host serves Fence.Wait by polling this slot, so it must not block.")
	case strings.HasPrefix(name, "stream_copy"):
		parts = append(parts, "A copy may run before the slot returns (then its error is the slot's status) or later (then its error surfaces at the next fence and at stream_synchronize). The host's buffer is borrowed until the next fence of the stream completes.")
		parts = append(parts, fmt.Sprintf("Limits and statuses: a length of 0 copies nothing and succeeds. %[1]s_ERR_INVALID_RANGE when a device range does not lie inside one live allocation or reservation of the instance, %[1]s_ERR_NOT_COMMITTED when part of it has no backing, %[1]s_ERR_READ_ONLY when a byte written lies in a read-only view, %[1]s_ERR_CLOSED for a stream the plugin does not know.", c.P))
	}
	switch name {
	case "stream_create", "stream_record":
		parts = append(parts, "Limits and statuses: "+c.P+"_ERR_OUT_OF_MEMORY when the plugin cannot make one; "+c.P+"_ERR_CLOSED (stream_record) for a stream it does not know.")
	case "stream_synchronize":
		parts = append(parts, "Limits and statuses: the first error of the stream's work, or "+c.P+"_ERR_CLOSED for a stream the plugin does not know.")
	case "fence_done":
		parts = append(parts, "Limits and statuses: "+c.P+"_ERR_RELEASED for a fence the plugin does not know.")
	}
	parts = append(parts, "Thread safety: any thread; the host never uses one stream from two threads at once, but different streams concurrently.")
	return strings.Join(parts, "\n\n")
}

// releaserOf names the slot that releases handles of type h.
func (c *cAbi) releaserOf(h string) string {
	for _, cp := range c.g.Spec.Capabilities {
		for _, m := range cp.Methods {
			if m.Releases != "" {
				if p := m.Param(m.Releases); p != nil && p.Type == h && m.Creates == "" {
					return cSnake(m.Name)
				}
			}
		}
	}
	return "its releasing slot"
}

// loaderFile returns a jennifer file of the loader package.
func (c *cAbi) loaderFile(name string) *File {
	return c.g.File(c.a.Loader+"/"+name, "")
}

func (c *cAbi) goMirrors() {
	a, g := c.a, c.g
	f := c.loaderFile("zz_generated.abi.go")
	comment(f, "The plugin C ABI version this loader speaks, from the spec's plugin_abi block,\nand the entry point a plugin of this major exports.")
	f.Const().Defs(
		Id("ABIMajor").Op("=").Lit(a.Major),
		Id("ABIMinor").Op("=").Lit(a.Minor),
		Id("ABIVersion").Uint32().Op("=").Id("ABIMajor").Op("<<").Lit(16).Op("|").Id("ABIMinor"),
		Id("EntrySymbol").Op("=").Lit(fmt.Sprintf("%s_plugin_v%d", c.p, a.Major)),
	)
	comment(f, "statusKinds maps the ABI's status codes (the index) to the contract's\nsentinel errors; code 0 is success.")
	f.Var().Id("statusKinds").Op("=").Index(Op("...")).Error().ValuesFunc(func(v *Group) {
		v.Nil()
		for _, e := range g.Spec.Errors {
			v.Add(g.C(e.Name))
		}
	})
	comment(f, "statusNames are the C names of the status codes.")
	f.Var().Id("statusNames").Op("=").Index(Op("...")).String().ValuesFunc(func(v *Group) {
		v.Lit(c.P + "_OK")
		for _, e := range g.Spec.Errors {
			v.Lit(c.statusConst(e))
		}
	})
	comment(f, "declaredPlugin is a plugin mechanism the spec declares.")
	f.Type().Id("declaredPlugin").Struct(
		Id("Device").Add(g.C("DeviceKind")),
		Id("Offers").Add(g.C(contractCapSet)),
		Id("Doc").String(),
	)
	comment(f, "declaredPlugins is the spec's allow-list (plugin_abi.plugins), by name: the\nplugins SpecAllowList accepts, each on its device with at most its offers.")
	f.Var().Id("declaredPlugins").Op("=").Map(g.C("MechanismID")).Id("declaredPlugin").Values(DictFunc(func(d Dict) {
		for _, p := range a.Plugins {
			var caps []Code
			for _, o := range p.Offers {
				if cp := g.Spec.Capability(o); cp != nil {
					caps = append(caps, g.C(capConst(cp)))
				}
			}
			d[Lit(p.Name)] = Values(Dict{
				Id("Device"): g.C("DeviceKind" + p.Device),
				Id("Offers"): g.C(contractOf).Call(caps...),
				Id("Doc"):    Lit(p.Doc),
			})
		}
	}))
	for _, s := range append(append(append([]*cStruct{}, c.data...), c.vtables...), c.desc) {
		comment(f, s.Go+" mirrors "+s.C+" of the header.")
		f.Type().Id(s.Go).StructFunc(func(st *Group) {
			for _, fl := range s.Fields {
				t := Id(fl.GoType)
				if fl.Array > 0 {
					t = Index(Lit(fl.Array)).Id(fl.GoType)
				}
				st.Id(fl.Go).Add(t).Comment(fl.C)
			}
		})
	}
	for _, s := range c.vtables {
		comment(f, "clearNewer zeroes the slots of "+s.C+" that a plugin of the given minor\ncannot have: the host never calls a slot newer than the plugin's minor.")
		f.Func().Params(Id("v").Op("*").Id(s.Go)).Id("clearNewer").Params(Id("minor").Uint32()).BlockFunc(func(b *Group) {
			for _, fl := range s.Fields {
				if fl.Since > 0 {
					b.If(Id("minor").Op("<").Lit(fl.Since)).Block(Id("v").Dot(fl.Go).Op("=").Lit(0))
				}
			}
		})
	}
}

// goLayoutTable writes the table the loader's layout test walks: every
// struct's C name, Go mirror, size, and each member's C name and offset as
// the generator computed them.
func (c *cAbi) goLayoutTable() {
	f := c.loaderFile("zz_generated.layout_test.go")
	comment(f, "cMember is one member of a C struct of the ABI.")
	f.Type().Id("cMember").Struct(Id("C").String(), Id("Go").String(), Id("Off").Uintptr())
	comment(f, "cLayout is one C struct of the ABI: its name, its Go mirror, its size and\nmembers as memgen computed them.")
	f.Type().Id("cLayout").Struct(Id("C").String(), Id("Go").Qual("reflect", "Type"), Id("Size").Uintptr(), Id("Members").Index().Id("cMember"))
	comment(f, "cLayouts lists every struct of include/memgen/mechanism.h.")
	f.Var().Id("cLayouts").Op("=").Index().Id("cLayout").ValuesFunc(func(v *Group) {
		for _, s := range append(append(append([]*cStruct{}, c.data...), c.vtables...), c.desc) {
			v.Values(Dict{
				Id("C"):    Lit(s.C),
				Id("Go"):   Qual("reflect", "TypeFor").Index(Id(s.Go)).Call(),
				Id("Size"): Lit(s.Size),
				Id("Members"): Index().Id("cMember").ValuesFunc(func(m *Group) {
					for _, fl := range s.Fields {
						m.Values(Lit(fl.C), Lit(fl.Go), Lit(fl.Off))
					}
				}),
			})
		}
	})
}
