package gen

import (
	"fmt"
	"strings"
)

// The plugin C ABI's model: the C structs the header declares, with the
// offsets and sizes the emitter computes itself (LP64, natural alignment),
// so that the header's static assertions, the Go mirrors of the loader and
// the layout test all come from one computation.

// cField is one member of a C struct.
type cField struct {
	C      string // C member name
	Go     string // Go mirror field name
	CType  string // C type, or the full declaration for a function pointer
	GoType string // Go mirror type, as source text
	Fn     bool   // a function pointer: CType is its declaration with %s for the name
	Array  int    // > 0: an array of that many elements
	Doc    string
	Since  int // the ABI minor that added the member
	Off    int
	nested *cStruct // a struct member
	size   int
	align  int
}

// cStruct is one C struct of the ABI.
type cStruct struct {
	C, Go  string
	Doc    string
	Fields []*cField
	VTable bool // versioned: struct_size and abi_version first
	Size   int
	align  int
}

// cAbi is the computed ABI of one spec.
type cAbi struct {
	g       *generator
	a       *pluginABI
	p, P    string              // prefix, upper-case prefix
	data    []*cStruct          // value structs (requests, ranges, handle outs)
	byType  map[string]*cStruct // spec type -> its C struct
	outs    map[string]*cStruct // handle type -> its out struct
	vtables []*cStruct          // one per capability, then the device context
	capVT   map[string]*cStruct // capability name -> vtable
	slotOf  map[*cField]*method // capability slot -> its method
	desc    *cStruct            // the plugin descriptor
	ctxDocs map[string]*method  // context slot C name -> spec method
}

// cSnake turns a Go name into lower snake case: CopyOnWrite -> copy_on_write.
func cSnake(n string) string { return strings.ReplaceAll(words(n), " ", "_") }

// cCamel turns snake case into an exported Go name: copy_on_write -> CopyOnWrite.
func cCamel(s string) string {
	var b strings.Builder
	for _, w := range strings.Split(s, "_") {
		if w != "" {
			b.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
	}
	return b.String()
}

func newCAbi(g *generator) (*cAbi, error) {
	a := g.Spec.PluginABI
	c := &cAbi{g: g, a: a, p: a.Prefix, P: strings.ToUpper(a.Prefix), byType: map[string]*cStruct{},
		outs: map[string]*cStruct{}, capVT: map[string]*cStruct{}, slotOf: map[*cField]*method{}, ctxDocs: map[string]*method{}}
	for _, cp := range g.Spec.Capabilities {
		vt := &cStruct{C: c.p + "_" + cSnake(cp.Name), Go: "c" + cp.Name, Doc: cp.Doc, VTable: true}
		type slot struct {
			f *cField
			m *method
		}
		var slots []slot
		for _, m := range cp.Methods {
			if c.fromDescriptor(m) {
				continue
			}
			f, err := c.capabilitySlot(m)
			if err != nil {
				return nil, err
			}
			f.Since = a.SlotSince(m)
			slots = append(slots, slot{f, m})
		}
		for minor := 0; minor <= a.Minor; minor++ {
			for _, s := range slots {
				if s.f.Since == minor {
					vt.Fields = append(vt.Fields, s.f)
					c.slotOf[s.f] = s.m
				}
			}
		}
		c.vtables = append(c.vtables, vt)
		c.capVT[cp.Name] = vt
	}
	ctx, err := c.contextVTable()
	if err != nil {
		return nil, err
	}
	c.vtables = append(c.vtables, ctx)
	c.desc = c.descriptor()
	for _, s := range append(append([]*cStruct{}, c.vtables...), c.desc) {
		s.Fields = append([]*cField{
			{C: "struct_size", Go: "StructSize", CType: "uint32_t", GoType: "uint32", size: 4, align: 4, Doc: "sizeof the struct as the plugin was built; the host reads no member at or past it."},
			{C: "abi_version", Go: "ABIVersion", CType: "uint32_t", GoType: "uint32", size: 4, align: 4, Doc: "The " + c.P + "_ABI_VERSION the plugin was built against."},
		}, s.Fields...)
	}
	for _, s := range append(append([]*cStruct{}, c.data...), append(c.vtables, c.desc)...) {
		s.layout()
	}
	return c, nil
}

// fromDescriptor reports whether m is answered by the descriptor rather than
// a slot: a query returning MechanismInfo (name, device, granularity).
func (c *cAbi) fromDescriptor(m *method) bool {
	return len(m.Returns) == 1 && m.Returns[0].Type == "MechanismInfo"
}

// scalarC returns the C and Go mirror types of a value-like spec type.
func (c *cAbi) scalarC(name string) (ctype, gotype string, size int, err error) {
	switch name {
	case "int":
		return "int64_t", "int64", 8, nil
	case "uint64":
		return "uint64_t", "uint64", 8, nil
	case "bool":
		return "int32_t", "int32", 4, nil
	}
	t := c.g.Spec.Type(name)
	switch {
	case t == nil:
	case t.Kind == KindHandle:
		return c.p + "_handle", "uint64", 8, nil
	case t.Kind == kindEnum:
		return c.p + "_" + cSnake(name), "int32", 4, nil
	case t.Kind == kindScalar && t.Go == "uint64":
		return c.p + "_" + cSnake(name), "uint64", 8, nil
	}
	return "", "", 0, fmt.Errorf("plugin ABI: spec type %q has no C form", name)
}

// dataStruct returns the C struct of a struct type, declaring it once.
func (c *cAbi) dataStruct(name string) (*cStruct, error) {
	if s := c.byType[name]; s != nil {
		return s, nil
	}
	t := c.g.Spec.Type(name)
	if t == nil || t.Kind != kindStruct {
		return nil, fmt.Errorf("plugin ABI: %q is not a struct type", name)
	}
	s := &cStruct{C: c.p + "_" + cSnake(name), Go: "c" + name, Doc: t.Doc}
	for _, f := range t.Fields {
		cf, err := c.valueField(cSnake(f.Name), f.Name, f.Type)
		if err != nil {
			return nil, err
		}
		s.Fields = append(s.Fields, cf)
	}
	c.byType[name] = s
	c.data = append(c.data, s)
	return s, nil
}

// valueField is a data member of spec type typ.
func (c *cAbi) valueField(cname, goname, typ string) (*cField, error) {
	if t := c.g.Spec.Type(typ); t != nil && t.Kind == kindStruct {
		s, err := c.dataStruct(typ)
		if err != nil {
			return nil, err
		}
		return &cField{C: cname, Go: goname, CType: s.C, GoType: s.Go, nested: s}, nil
	}
	ct, gt, size, err := c.scalarC(typ)
	if err != nil {
		return nil, err
	}
	return &cField{C: cname, Go: goname, CType: ct, GoType: gt, size: size, align: size}, nil
}

// outStruct returns the struct a creating slot fills: the plugin's id for the
// new handle, then the handle's fields.
func (c *cAbi) outStruct(handle string) (*cStruct, error) {
	if s := c.outs[handle]; s != nil {
		return s, nil
	}
	t := c.g.Spec.Type(handle)
	s := &cStruct{C: c.p + "_" + cSnake(handle) + "_out", Go: "c" + handle + "Out",
		Doc: "What a slot that creates " + article(handle) + " " + handle + " writes: the plugin's id for it, then its fields. " + t.Doc}
	s.Fields = append(s.Fields, &cField{C: "id", Go: "ID", CType: c.p + "_handle", GoType: "uint64", size: 8, align: 8,
		Doc: "In: the id the host assigned to the new handle, written before the call (nonzero, never used before in the process). The plugin files the new object under it and leaves it unchanged; the host treats a changed id as a protocol error."})
	for _, f := range t.Fields {
		cf, err := c.valueField(cSnake(f.Name), f.Name, f.Type)
		if err != nil {
			return nil, err
		}
		s.Fields = append(s.Fields, cf)
	}
	c.outs[handle] = s
	c.data = append(c.data, s)
	return s, nil
}

// isRole reports whether typ is the interface of one of the given roles.
func (c *cAbi) isRole(typ string, roles ...string) bool {
	i := c.g.Spec.interfaceNamed(typ)
	return i != nil && contains(roles, i.Role)
}

// capabilitySlot is the function pointer of a capability method: the plugin
// instance first, then the parameters the plugin sees (no context, no grant,
// no account), then the out parameters; it returns the status, or the value
// itself for a method whose only result is not an error.
func (c *cAbi) capabilitySlot(m *method) (*cField, error) {
	params := []string{"void *instance"}
	if m.Accounting.Effect == effectConsumes {
		params = append(params, "uint64_t deadline_ns")
	}
	for _, p := range m.Params {
		if p.Type == "context.Context" || c.isRole(p.Type, roleGrant, roleAccount) {
			continue
		}
		if t := c.g.Spec.Type(p.Type); t != nil && t.Kind == kindStruct {
			s, err := c.dataStruct(p.Type)
			if err != nil {
				return nil, err
			}
			params = append(params, "const "+s.C+" *"+cSnake(p.Name))
			continue
		}
		ct, _, _, err := c.scalarC(p.Type)
		if err != nil {
			return nil, err
		}
		params = append(params, ct+" "+cSnake(p.Name))
	}
	ret := c.p + "_status"
	var outs []*param
	for _, r := range m.Returns {
		if r.Type != "error" {
			outs = append(outs, r)
		}
	}
	if !m.ReturnsError() && len(outs) == 1 {
		ct, _, _, err := c.scalarC(outs[0].Type)
		if err != nil {
			return nil, err
		}
		ret, outs = ct, nil
	}
	for i, r := range outs {
		name := "out"
		if len(outs) > 1 {
			name = fmt.Sprintf("out%d", i)
		}
		if c.g.IsHandle(r.Type) {
			s, err := c.outStruct(r.Type)
			if err != nil {
				return nil, err
			}
			params = append(params, s.C+" *"+name)
			continue
		}
		ct, _, _, err := c.scalarC(r.Type)
		if err != nil {
			return nil, err
		}
		params = append(params, ct+" *"+name)
	}
	return &cField{C: cSnake(m.Name), Go: m.Name, Fn: true, CType: ret + " (*%s)(" + strings.Join(params, ", ") + ")",
		GoType: "uintptr", size: 8, align: 8, Doc: m.Doc}, nil
}

// contextVTable is the device context's struct: streams and fences, from the
// spec's context, stream and fence interfaces. The context's Device comes
// from the descriptor and its Close is the instance's; Fence.Wait and
// Fence.Ready are served on the host by polling fence_done; fence_release is
// the ABI's own, since a C fence has no garbage collector.
func (c *cAbi) contextVTable() (*cStruct, error) {
	s := &cStruct{C: c.p + "_device_context", Go: "cDeviceContext", VTable: true}
	if i := c.g.Spec.roleInterface(roleContext); i != nil {
		s.Doc = i.Doc
	}
	add := func(name, decl string, m *method, doc string) {
		if m != nil {
			doc = m.Doc
			c.ctxDocs[name] = m
		}
		s.Fields = append(s.Fields, &cField{C: name, Go: cCamel(name), Fn: true, CType: decl, GoType: "uintptr", size: 8, align: 8, Doc: doc})
	}
	st := c.p + "_status (*%s)("
	h := c.p + "_handle"
	if i := c.g.Spec.roleInterface(roleContext); i != nil {
		for _, m := range i.Methods {
			if len(m.Returns) > 0 && c.isRole(m.Returns[0].Type, roleStream) {
				add("stream_create", st+"void *instance, "+h+" *out_stream)", m, "")
			}
		}
	}
	if i := c.g.Spec.roleInterface(roleStream); i != nil {
		for _, m := range i.Methods {
			params := []string{"void *instance", h + " stream"}
			for _, p := range m.Params {
				switch {
				case p.Type == "context.Context":
				case p.Type == "[]byte" && p.Name == "dst":
					params = append(params, "void *"+p.Name, "uint64_t "+p.Name+"_len")
				case p.Type == "[]byte":
					params = append(params, "const void *"+p.Name, "uint64_t "+p.Name+"_len")
				default:
					ct, _, _, err := c.scalarC(p.Type)
					if err != nil {
						return nil, err
					}
					params = append(params, ct+" "+p.Name)
				}
			}
			for _, r := range m.Returns {
				if c.isRole(r.Type, roleFence) {
					params = append(params, h+" *out_fence")
				}
			}
			add("stream_"+cSnake(m.Name), st+strings.Join(params, ", ")+")", m, "")
		}
	}
	if i := c.g.Spec.roleInterface(roleFence); i != nil {
		for _, m := range i.Methods {
			if len(m.Returns) == 1 && m.Returns[0].Type == "bool" {
				add("fence_"+cSnake(m.Name), st+"void *instance, "+h+" fence, int32_t *out_done)", m, "")
			}
		}
	}
	add("fence_release", "void (*%s)(void *instance, "+h+" fence)", nil,
		"fence_release frees a fence id returned by stream_record. The host calls it exactly once per fence, when the fence is no longer referenced.")
	return s, nil
}

// maxConfig bounds open's configuration string.
const maxConfig = 4096

// openOut is the struct open fills: the instance and its per-instance
// figures, declared once among the value structs.
func (c *cAbi) openOut() *cStruct {
	name := c.p + "_open_out"
	for _, s := range c.data {
		if s.C == name {
			return s
		}
	}
	s := &cStruct{C: name, Go: "cOpenOut", Doc: "What open writes: the new instance and the figures of this instance, which the host prefilled with the descriptor's.", Fields: []*cField{
		{C: "instance", Go: "Instance", CType: "void *", GoType: "uintptr", size: 8, align: 8, Doc: "The new instance, passed to every slot; non-NULL on " + c.P + "_OK."},
		{C: "alloc_granularity", Go: "AllocGranularity", CType: c.p + "_bytes", GoType: "uint64", size: 8, align: 8, Doc: "Allocate rounds sizes up to this (a power of two)."},
		{C: "granularity", Go: "Granularity", CType: c.p + "_bytes", GoType: "uint64", size: 8, align: 8, Doc: "VirtualBacking and SharedMapping work in multiples of this (a power of two)."},
		{C: "ordinal", Go: "Ordinal", CType: "int32_t", GoType: "int32", size: 4, align: 4, Doc: "The device's ordinal."},
	}}
	c.data = append(c.data, s)
	return s
}

// descriptor is the struct memgen_plugin_v<major> returns.
func (c *cAbi) descriptor() *cStruct {
	d := &cStruct{C: c.p + "_plugin", Go: "cPlugin", VTable: true,
		Doc: "The plugin descriptor: static data the entry point returns, valid until the library is unloaded (never, in practice)."}
	u64 := func(cn, doc string) *cField {
		return &cField{C: cn, Go: cCamel(cn), CType: c.p + "_bytes", GoType: "uint64", size: 8, align: 8, Doc: doc}
	}
	d.Fields = []*cField{
		{C: "name", Go: "Name", CType: "const char *", GoType: "uintptr", size: 8, align: 8,
			Doc: "The plugin's name, which the host reports as the mechanism's (Info().Mechanism): NUL-terminated, static, 1 to 63 bytes of [a-z0-9_-]. Any name loads; a host given an allow-list (the spec's plugin_abi.plugins) refuses names not on it."},
		{C: "device", Go: "Device", CType: c.p + "_device_kind", GoType: "int32", size: 4, align: 4, Doc: "The kind of device the plugin serves."},
		{C: "ordinal", Go: "Ordinal", CType: "int32_t", GoType: "int32", size: 4, align: 4, Doc: "The device's ordinal by default; open may set another per instance."},
		u64("alloc_granularity", "Allocate rounds sizes up to this (a power of two) by default; open may set another per instance."),
		u64("granularity", "VirtualBacking and SharedMapping work in multiples of this (a power of two) by default; open may set another per instance. 0 only for a plugin offering DeviceAllocator alone."),
		{C: "open", Go: "Open", Fn: true, CType: c.p + "_status (*%s)(const char *config, " + c.openOut().C + " *out)", GoType: "uintptr", size: 8, align: 8,
			Doc: "open creates an instance: an independent mechanism whose handles are its own. config is the host's configuration string (never NULL; \"\" when none): key=value pairs separated by commas, at most " + fmt.Sprint(maxConfig) + " bytes, whose keys the plugin defines (\"granularity=65536,ordinal=1\"). The host fills *out with the descriptor's ordinal and granularities before the call; the plugin sets out->instance and may change the others for this instance (powers of two). An unknown key or a bad value is " + c.P + "_ERR_UNSUPPORTED; a device that is absent " + c.P + "_ERR_UNAVAILABLE. Required."},
		{C: "close", Go: "Close", Fn: true, CType: "void (*%s)(void *instance)", GoType: "uintptr", size: 8, align: 8,
			Doc: "close destroys an instance. The host calls it once, after releasing every handle it could; the plugin frees whatever is left (quarantined objects included). Required."},
		{C: "last_error", Go: "LastError", Fn: true, CType: "uint64_t (*%s)(void *instance, char *buf, uint64_t cap)", GoType: "uintptr", size: 8, align: 8,
			Doc: "last_error writes the message of the last slot of this instance that failed on the calling thread into buf (at most cap bytes, NUL-terminated, cap is at least 1) and returns its length without the NUL; 0 when there is none. The host calls it on the same thread right after a slot returned an error status, and appends the message to the error it returns. Optional: NULL means no messages."},
	}
	for _, vt := range c.vtables {
		d.Fields = append(d.Fields, &cField{C: strings.TrimPrefix(vt.C, c.p+"_"), Go: strings.TrimPrefix(vt.Go, "c"),
			CType: "const " + vt.C + " *", GoType: "uintptr", size: 8, align: 8,
			Doc: "The " + strings.TrimPrefix(vt.Go, "c") + " slots, or NULL when the plugin does not offer them."})
	}
	d.Fields = append(d.Fields, &cField{C: "reserved", Go: "Reserved", CType: "const void *", GoType: "uintptr", Array: c.a.Reserved,
		size: 8, align: 8, Doc: "Reserved for later minors, which carve new members out of it: set to NULL."})
	return d
}

// layout computes offsets, size and alignment (LP64).
func (s *cStruct) layout() {
	off, al := 0, 1
	for _, f := range s.Fields {
		sz, a := f.size, f.align
		if f.nested != nil { // laid out already: data structs come in dependency order
			sz, a = f.nested.Size, f.nested.align
		}
		if f.Array > 0 {
			sz *= f.Array
		}
		if a == 0 {
			a = 1
		}
		off = (off + a - 1) / a * a
		f.Off = off
		off += sz
		al = max(al, a)
	}
	s.Size = (off + al - 1) / al * al
	s.align = al
}
