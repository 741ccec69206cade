package gen

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
)

const schemaFile = "../spec/capabilities.schema.json"

// TestSchemaMatchesLoader holds spec/capabilities.schema.json and the loader
// together: for every object of the spec language the schema lists exactly
// the keys the loader accepts, requires exactly the keys the loader insists
// on, and rejects any other key.
func TestSchemaMatchesLoader(t *testing.T) {
	data, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatalf("%s is not valid JSON: %v", schemaFile, err)
	}
	if got := schema["$schema"]; got != "https://json-schema.org/draft/2020-12/schema" {
		t.Errorf("$schema = %v, want draft 2020-12", got)
	}
	defs, _ := schema["$defs"].(map[string]any)
	object := func(name string) map[string]any {
		if name == "spec" {
			return schema
		}
		d, _ := defs[name].(map[string]any)
		return d
	}
	for _, name := range sortedNames(specKeys) {
		obj := object(name)
		if obj == nil {
			t.Errorf("schema has no definition %q for the loader's %s object", name, name)
			continue
		}
		props, _ := obj["properties"].(map[string]any)
		if got, want := keysOf(props), sorted(specKeys[name]); !slices.Equal(got, want) {
			t.Errorf("%s: schema properties %v, loader accepts %v", name, got, want)
		}
		if obj["additionalProperties"] != false {
			t.Errorf("%s: schema allows keys the loader rejects (additionalProperties is not false)", name)
		}
		var req []string
		for _, r := range asSlice(obj["required"]) {
			req = append(req, r.(string))
		}
		if got, want := sorted(req), sorted(specRequired[name]); !slices.Equal(got, want) {
			t.Errorf("%s: schema requires %v, loader requires %v", name, got, want)
		}
	}
	// And the other way round: every closed object of the schema is one the
	// loader knows.
	for name, d := range defs {
		if obj, _ := d.(map[string]any); obj["additionalProperties"] == false {
			if _, ok := specKeys[name]; !ok {
				t.Errorf("schema definition %q has no counterpart in the loader's specKeys", name)
			}
		}
	}
}

// TestSchemaValidates checks the schema against real documents: the real
// spec and the valid golden cases conform, and the cases whose errors are
// structural (unknown keys, wrong shapes, bad version) do not.
func TestSchemaValidates(t *testing.T) {
	c := jsonschema.NewCompiler()
	sch, err := c.Compile(schemaFile)
	if err != nil {
		t.Fatalf("schema does not compile: %v", err)
	}
	inst := func(t *testing.T, file string) any {
		t.Helper()
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := yaml.Unmarshal(data, &v); err != nil {
			t.Fatal(err)
		}
		// Round-trip through JSON: the validator takes JSON values.
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		out, err := jsonschema.UnmarshalJSON(strings.NewReader(string(j)))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	valid := []string{realSpec}
	for _, dir := range goldenCases(t) {
		if _, err := os.Stat(filepath.Join(dir, "expected")); err == nil {
			valid = append(valid, filepath.Join(dir, "spec.yaml"))
		}
	}
	for _, f := range valid {
		if err := sch.Validate(inst(t, f)); err != nil {
			t.Errorf("%s does not conform to the schema:\n%v", f, err)
		}
	}
	for _, name := range []string{
		"err_unknown_key", "err_wrong_shapes", "err_version_and_sections", "err_names",
		"err_consume_without_from", "err_invariant_names_nothing", "err_mechanism_fields",
		"err_bad_requires", "err_bad_accounting_expr", "err_not_a_mapping",
	} {
		f := filepath.Join("testdata", name, "spec.yaml")
		if err := sch.Validate(inst(t, f)); err == nil {
			t.Errorf("%s conforms to the schema, but the loader rejects it", f)
		}
	}
}

func keysOf(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sorted(xs []string) []string {
	out := append([]string(nil), xs...)
	sort.Strings(out)
	return out
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// TestSchemaEnforcers keeps the schema's vocabulary of enforced_by, and of
// granularity, equal to the loader's.
func TestSchemaEnforcers(t *testing.T) {
	data, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Defs map[string]struct {
			Properties map[string]struct {
				Enum  []string
				Items struct{ Enum []string }
			}
		} `json:"$defs"`
	}
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatal(err)
	}
	if got, want := sorted(schema.Defs["invariant"].Properties["enforced_by"].Items.Enum), enforcerNames(); !slices.Equal(got, want) {
		t.Errorf("schema's enforced_by vocabulary %v, the loader's (Enforcers) %v", got, want)
	}
	if got, want := sorted(schema.Defs["mechanism"].Properties["granularity"].Enum), sorted(granularities); !slices.Equal(got, want) {
		t.Errorf("schema's granularity values %v, the loader's %v", got, want)
	}
}
