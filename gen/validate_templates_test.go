package gen

import (
	"os"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestLoaderPromiseHoldsForEachDeclaration holds the loader to its promise
// one declaration at a time: with any one field of a spec type renamed, any
// one type or error removed, or any one capability method renamed, the
// loader either rejects the spec or the generated code type-checks. A template that leans on a declaration neededTypes does
// not list fails here, naming it, rather than in a fuzzer's lucky draw.
func TestLoaderPromiseHoldsForEachDeclaration(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks one generation per declaration")
	}
	data, err := os.ReadFile(realSpec)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	typesNode := mapValue(doc.Content[0], "types")
	if typesNode == nil {
		t.Fatal("the spec has no types section")
	}
	try := func(t *testing.T, mutate func()) {
		t.Helper()
		var mutant yaml.Node
		if err := yaml.Unmarshal(data, &mutant); err != nil {
			t.Fatal(err)
		}
		doc = mutant
		typesNode = mapValue(doc.Content[0], "types")
		mutate()
		out, err := yaml.Marshal(&doc)
		if err != nil {
			t.Fatal(err)
		}
		s, err := Load(specName, out)
		if err != nil {
			return // rejected: the promise holds
		}
		files, err := Generate(s, Config{Module: goldenModule})
		if err != nil {
			t.Fatalf("the loader accepted the spec, but generation failed:\n%v", err)
		}
		if err := typeCheck(s, goldenModule, files); err != nil {
			t.Fatalf("the loader accepted the spec, but the generated code does not type-check:\n%v", err)
		}
	}
	var names []string
	fields := map[string][]string{}
	for i := 0; i+1 < len(typesNode.Content); i += 2 {
		name := typesNode.Content[i].Value
		names = append(names, name)
		if f := mapValue(typesNode.Content[i+1], "fields"); f != nil {
			for j := 0; j+1 < len(f.Content); j += 2 {
				fields[name] = append(fields[name], f.Content[j].Value)
			}
		}
	}
	for _, section := range []string{"errors"} {
		sec := mapValue(doc.Content[0], section)
		for i := 0; i+1 < len(sec.Content); i += 2 {
			name := sec.Content[i].Value
			t.Run("without "+name, func(t *testing.T) {
				try(t, func() { deleteKey(mapValue(doc.Content[0], section), name) })
			})
		}
	}
	caps := mapValue(doc.Content[0], "capabilities")
	for i := 0; i+1 < len(caps.Content); i += 2 {
		capName := caps.Content[i].Value
		methods := mapValue(caps.Content[i+1], "methods")
		for j := 0; methods != nil && j+1 < len(methods.Content); j += 2 {
			m := methods.Content[j].Value
			t.Run("renamed "+capName+"."+m, func(t *testing.T) {
				try(t, func() {
					ms := mapValue(mapValue(mapValue(doc.Content[0], "capabilities"), capName), "methods")
					for k := 0; k+1 < len(ms.Content); k += 2 {
						if ms.Content[k].Value == m {
							ms.Content[k].Value = m + "Renamed"
						}
					}
				})
			})
		}
	}
	for _, name := range names {
		t.Run("without "+name, func(t *testing.T) {
			try(t, func() { deleteKey(typesNode, name) })
		})
		for _, field := range fields[name] {
			t.Run("renamed "+name+"."+field, func(t *testing.T) {
				try(t, func() {
					f := mapValue(mapValue(typesNode, name), "fields")
					for j := 0; j+1 < len(f.Content); j += 2 {
						if f.Content[j].Value == field {
							f.Content[j].Value = field + "Renamed"
						}
					}
				})
			})
		}
	}
}

// mapValue is the value under key in a YAML mapping node, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// deleteKey removes key and its value from a YAML mapping node.
func deleteKey(n *yaml.Node, key string) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			n.Content = append(n.Content[:i:i], n.Content[i+2:]...)
			return
		}
	}
}
