package plugin

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/memgen/memgen/generated/memapi"
)

// Library is a loaded plugin whose descriptor passed version negotiation and
// validation. Its slots are read once, at Open, into Go mirrors of the
// header's structs: a slot the plugin's struct_size or minor does not cover
// is zero there, and a capability with any zero slot is absent. New makes
// mechanism instances of it.
//
// A Library is never unloaded: mechanisms and fences may call into it until
// the process ends, and dlclose under them would be a use after free.
type Library struct {
	Path    string
	Name    memapi.MechanismID
	Device  memapi.DeviceKey
	Version uint32 // the plugin's abi_version (major << 16 | minor)

	desc    cPlugin
	da      cDeviceAllocator
	vb      cVirtualBacking
	sm      cSharedMapping
	dc      cDeviceContext
	offers  memapi.CapSet
	context bool // the device-context slots are all present
	slots   map[uintptr]string
}

// Allowed is one entry of an allow-list: the device a plugin of that name
// must serve and the most it may offer (DeviceAllocator is always offered).
type Allowed struct {
	Device memapi.DeviceKind
	Offers memapi.CapSet
}

// OpenOption configures Open.
type OpenOption func(*openConfig)

type openConfig struct {
	allow map[memapi.MechanismID]Allowed
}

// WithAllowList makes Open refuse a plugin whose name is not in list, or
// whose device is not the listed one (ErrUndeclared), and limits its offers
// to the listed ones. Without it any plugin loads under its own name.
func WithAllowList(list map[memapi.MechanismID]Allowed) OpenOption {
	return func(c *openConfig) { c.allow = list }
}

// SpecAllowList is WithAllowList with the plugins the spec lists under
// plugin_abi.plugins, each on its listed device with at most its listed
// offers.
func SpecAllowList() OpenOption {
	list := make(map[memapi.MechanismID]Allowed, len(declaredPlugins))
	for name, d := range declaredPlugins {
		list[name] = Allowed{Device: d.Device, Offers: d.Offers}
	}
	return WithAllowList(list)
}

var (
	openMu sync.Mutex
	opened = map[string]*Library{}
)

// Open loads the plugin at path (a file path or a soname) at run time,
// negotiates the ABI version and validates the descriptor. Any plugin of
// this major loads under the name its descriptor carries, unless an
// allow-list is given (WithAllowList, SpecAllowList). Every failure is a
// *LoadError wrapping one of ErrNoLibrary, ErrNoEntry, ErrNullDescriptor,
// ErrIncompatible, ErrBadDescriptor or ErrUndeclared. A library that loaded
// is cached by path: Open of the same path reads the descriptor once.
func Open(path string, opts ...OpenOption) (*Library, error) {
	var cfg openConfig
	for _, o := range opts {
		o(&cfg)
	}
	openMu.Lock()
	l, ok := opened[path]
	if !ok {
		var err error
		if l, err = load(path); err != nil {
			openMu.Unlock()
			return nil, err
		}
		opened[path] = l
	}
	openMu.Unlock()
	if cfg.allow == nil {
		return l, nil
	}
	a, ok := cfg.allow[l.Name]
	if !ok {
		return nil, loadErr(path, ErrUndeclared, "plugin %q is not on the allow-list", l.Name)
	}
	if l.Device.Kind != a.Device {
		return nil, loadErr(path, ErrUndeclared, "plugin %q serves %v, the allow-list says %v", l.Name, l.Device.Kind, a.Device)
	}
	lim := *l
	lim.offers &= a.Offers | memapi.Of(memapi.CapDeviceAllocator)
	return &lim, nil
}

// load runs on a locked OS thread: dlerror's state is per thread, and
// handles and addresses are judged by being non-zero, never by the message.
func load(path string) (*Library, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil || h == 0 {
		if err == nil {
			err = errors.New("dlopen returned no handle")
		}
		return nil, &LoadError{Path: path, Kind: ErrNoLibrary, Err: err}
	}
	entry, err := purego.Dlsym(h, EntrySymbol)
	if err != nil || entry == 0 {
		_ = purego.Dlclose(h)
		return nil, &LoadError{Path: path, Kind: ErrNoEntry, Detail: "no symbol " + EntrySymbol, Err: err}
	}
	l, lerr := negotiate(path, entry)
	if lerr != nil {
		// Nothing of the plugin was opened yet: it can be unloaded.
		_ = purego.Dlclose(h)
		return nil, lerr
	}
	return l, nil
}

// header is the first two members of every versioned struct.
type header struct{ StructSize, ABIVersion uint32 }

func majorOf(v uint32) uint32 { return v >> 16 }
func minorOf(v uint32) uint32 { return v & 0xffff }

// negotiate calls the entry point and validates what it returns.
func negotiate(path string, entry uintptr) (*Library, *LoadError) {
	r, err := callC(entry, uintptr(ABIVersion))
	if err != nil {
		return nil, &LoadError{Path: path, Kind: ErrBadDescriptor, Detail: "calling " + EntrySymbol, Err: err}
	}
	if r == 0 {
		return nil, loadErr(path, ErrNullDescriptor, "%s(%#x) returned NULL", EntrySymbol, ABIVersion)
	}
	l := &Library{Path: path}
	var hd header
	readStruct(bytesOf(&hd), r, uint32(unsafe.Sizeof(hd)))
	// The version first: a descriptor of another major may be laid out
	// differently, so nothing else of it is read (DLPack's rule).
	if majorOf(hd.ABIVersion) != ABIMajor {
		return nil, loadErr(path, ErrIncompatible, "the plugin speaks ABI %d.%d, this host %d.%d",
			majorOf(hd.ABIVersion), minorOf(hd.ABIVersion), ABIMajor, ABIMinor)
	}
	if hd.StructSize < uint32(unsafe.Sizeof(l.desc)) {
		return nil, loadErr(path, ErrBadDescriptor, "descriptor struct_size %d is smaller than the %d bytes of ABI %d.0",
			hd.StructSize, unsafe.Sizeof(l.desc), ABIMajor)
	}
	l.Version = hd.ABIVersion
	readStruct(bytesOf(&l.desc), r, hd.StructSize)
	d := &l.desc
	name, ok := cString(d.Name)
	if !ok || name == "" {
		return nil, loadErr(path, ErrBadDescriptor, "the descriptor's name is NULL, empty or longer than %d bytes", maxName)
	}
	if !validName(name) {
		return nil, loadErr(path, ErrBadDescriptor, "the descriptor's name %q is not 1 to 63 bytes of [a-z0-9_-]", name)
	}
	l.Name = memapi.MechanismID(name)
	kind := memapi.DeviceKind(d.Device)
	if d.Device <= 0 || d.Device > 255 || !kind.Valid() {
		return nil, loadErr(path, ErrBadDescriptor, "device %d is not a memgen_device_kind value", d.Device)
	}
	l.Device = memapi.DeviceKey{Kind: kind, Ordinal: int(d.Ordinal)}
	if g := d.AllocGranularity; !pow2(g) {
		return nil, loadErr(path, ErrBadDescriptor, "alloc_granularity %d is not a power of two", g)
	}
	if g := d.Granularity; g != 0 && !pow2(g) {
		return nil, loadErr(path, ErrBadDescriptor, "granularity %d is not a power of two", g)
	}
	if d.Open == 0 || d.Close == 0 {
		return nil, loadErr(path, ErrBadDescriptor, "open and close are required slots")
	}
	var lerr *LoadError
	read := func(what string, addr uintptr, dst []byte, clear func(uint32)) bool {
		if addr == 0 || lerr != nil {
			return false
		}
		var h header
		readStruct(bytesOf(&h), addr, uint32(unsafe.Sizeof(h)))
		switch {
		case majorOf(h.ABIVersion) != ABIMajor:
			lerr = loadErr(path, ErrIncompatible, "%s is of ABI %d.%d", what, majorOf(h.ABIVersion), minorOf(h.ABIVersion))
		case h.StructSize < uint32(unsafe.Sizeof(h)) || h.StructSize%8 != 0:
			lerr = loadErr(path, ErrBadDescriptor, "%s struct_size %d is not a multiple of 8 of at least 8", what, h.StructSize)
		default:
			readStruct(dst, addr, h.StructSize)
			clear(minorOf(h.ABIVersion))
			return true
		}
		return false
	}
	read("device_allocator", d.DeviceAllocator, bytesOf(&l.da), l.da.clearNewer)
	read("virtual_backing", d.VirtualBacking, bytesOf(&l.vb), l.vb.clearNewer)
	read("shared_mapping", d.SharedMapping, bytesOf(&l.sm), l.sm.clearNewer)
	read("device_context", d.DeviceContext, bytesOf(&l.dc), l.dc.clearNewer)
	if lerr != nil {
		return nil, lerr
	}
	if !allSlots(&l.da) {
		return nil, loadErr(path, ErrBadDescriptor, "DeviceAllocator is required, but its struct or a slot of it is missing")
	}
	l.offers = memapi.Of(memapi.CapDeviceAllocator)
	if allSlots(&l.vb) {
		l.offers |= memapi.Of(memapi.CapVirtualBacking)
	}
	if allSlots(&l.sm) {
		l.offers |= memapi.Of(memapi.CapSharedMapping)
	}
	if l.offers != memapi.Of(memapi.CapDeviceAllocator) && d.Granularity == 0 {
		return nil, loadErr(path, ErrBadDescriptor, "granularity is 0, but the plugin offers %v", l.offers)
	}
	l.context = allSlots(&l.dc)
	l.slots = slotNames(l)
	return l, nil
}

// slotNames maps the address of each of l's slots to its C name.
func slotNames(l *Library) map[uintptr]string {
	names := map[uintptr]string{l.desc.Open: "open", l.desc.Close: "close", l.desc.LastError: "last_error"}
	for _, s := range []any{&l.da, &l.vb, &l.sm, &l.dc} {
		v := reflect.ValueOf(s).Elem()
		for i := range v.NumField() {
			if f := v.Field(i); f.Kind() == reflect.Uintptr && f.Uint() != 0 {
				names[uintptr(f.Uint())] = snakeCase(v.Type().Field(i).Name)
			}
		}
	}
	delete(names, 0)
	return names
}

// snakeCase turns a mirror's Go field name into the header's member name
// (CopyOnWrite: copy_on_write).
func snakeCase(s string) string {
	var b strings.Builder
	for i, c := range s {
		if c >= 'A' && c <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			c += 'a' - 'A'
		}
		b.WriteRune(c)
	}
	return b.String()
}

// slotName is the C name of the slot at fn, or its address.
func (l *Library) slotName(fn uintptr) string {
	if n, ok := l.slots[fn]; ok {
		return n
	}
	return fmt.Sprintf("%#x", fn)
}

func pow2(n uint64) bool { return n != 0 && n&(n-1) == 0 }

// validName reports whether a plugin name is 1 to 63 bytes of [a-z0-9_-].
func validName(s string) bool {
	if s == "" || len(s) >= maxName {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Declaration is what the plugin declares about itself through its
// descriptor, in the form the spec declares Go mechanisms: its name, device,
// the capabilities whose slots are all present (as limited by an
// allow-list) and its granularity kind: "configurable" for host memory (a
// power of two and a multiple of the page, as the plugin maps host pages),
// "device" otherwise. The conformance suite checks an instance against it
// (conformance.Subject.Declared).
func (l *Library) Declaration() memapi.MechanismMeta {
	gk := "device"
	if l.Device.Kind == memapi.DeviceKindHost {
		gk = "configurable"
	}
	return memapi.MechanismMeta{
		Name:        l.Name,
		Package:     l.Path,
		Type:        "plugin descriptor",
		Device:      l.Device.Kind.String(),
		Offers:      l.offers,
		Granularity: gk,
		Doc:         l.String(),
	}
}

// allSlots reports whether every slot (every member after the header) of a
// mirrored struct of slots is set.
func allSlots[T any](v *T) bool {
	b := bytesOf(v)
	for off := int(unsafe.Sizeof(header{})); off+8 <= len(b); off += 8 {
		if *(*uintptr)(unsafe.Pointer(&b[off])) == 0 {
			return false
		}
	}
	return true
}

// Offers returns the capabilities the plugin offers: DeviceAllocator, and
// each optional capability whose slots are all present (and which the
// allow-list, if Open was given one, lists for the plugin).
func (l *Library) Offers() memapi.CapSet { return l.offers }

// HasContext reports whether the plugin has the device-context slots.
func (l *Library) HasContext() bool { return l.context }

func (l *Library) String() string {
	return fmt.Sprintf("plugin %s (ABI %d.%d, %s, %v)", l.Name, majorOf(l.Version), minorOf(l.Version), l.Path, l.offers)
}
