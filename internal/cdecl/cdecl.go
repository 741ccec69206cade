// Package cdecl reads the C types an object file declares from its DWARF
// debug information, and renders them as comparable strings. The
// integrations (ONNX Runtime, llama.cpp) keep their own minimal C
// declarations of a third-party API; their tests compile those and
// upstream's header with -g and compare what this package reads from each,
// so a field at the wrong offset, a missing enum value or a wrong slot
// signature fails a test instead of corrupting memory at run time.
package cdecl

import (
	"debug/dwarf"
	"debug/elf"
	"fmt"
	"sort"
	"strings"
)

// Decls is what one translation unit declares, as the compiler saw it.
type Decls struct {
	Structs  map[string]*dwarf.StructType // by tag (structs and unions); a definition wins over a declaration
	Enums    map[string]*dwarf.EnumType   // by tag
	Typedefs map[string]*dwarf.TypedefType
}

// Read returns the named structs, unions, enums and typedefs of the ELF
// object at path (compiled with -g).
func Read(path string) (*Decls, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d, err := f.DWARF()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	decl := &Decls{Structs: map[string]*dwarf.StructType{}, Enums: map[string]*dwarf.EnumType{}, Typedefs: map[string]*dwarf.TypedefType{}}
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if e == nil {
			return decl, nil
		}
		switch e.Tag {
		case dwarf.TagStructType, dwarf.TagUnionType, dwarf.TagEnumerationType, dwarf.TagTypedef:
		default:
			continue
		}
		if _, named := e.Val(dwarf.AttrName).(string); !named {
			continue
		}
		typ, err := d.Type(e.Offset)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		switch typ := typ.(type) {
		case *dwarf.StructType:
			if old, ok := decl.Structs[typ.StructName]; !ok || old.Incomplete {
				decl.Structs[typ.StructName] = typ
			}
		case *dwarf.EnumType:
			decl.Enums[typ.EnumName] = typ
		case *dwarf.TypedefType:
			decl.Typedefs[typ.Name] = typ
		}
	}
}

// Canon renders t as a comparable string: typedefs resolved, named structs
// and enums by tag, anonymous ones by their fields and offsets.
func Canon(t dwarf.Type) string {
	switch t := t.(type) {
	case nil:
		return "void"
	case *dwarf.TypedefType:
		return Canon(t.Type)
	case *dwarf.QualType:
		return t.Qual + " " + Canon(t.Type)
	case *dwarf.PtrType:
		return "*" + Canon(t.Type)
	case *dwarf.ArrayType:
		return fmt.Sprintf("[%d]%s", t.Count, Canon(t.Type))
	case *dwarf.StructType:
		if t.StructName != "" {
			return t.Kind + " " + t.StructName
		}
		var fs []string
		for _, f := range t.Field {
			fs = append(fs, fmt.Sprintf("%s@%d %s", f.Name, f.ByteOffset, Canon(f.Type)))
		}
		return t.Kind + " {" + strings.Join(fs, "; ") + "}"
	case *dwarf.EnumType:
		if t.EnumName != "" {
			return "enum " + t.EnumName
		}
		return t.String()
	case *dwarf.FuncType:
		var ps []string
		for _, p := range t.ParamType {
			ps = append(ps, Canon(p))
		}
		return "func(" + strings.Join(ps, ", ") + ") " + Canon(t.ReturnType)
	case *dwarf.VoidType:
		return "void"
	case *dwarf.DotDotDotType:
		return "..."
	default:
		return fmt.Sprintf("%s(%d bytes)", t.String(), t.Size())
	}
}

// SortedKeys returns m's keys in order, for reports that read the same on
// every run.
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
