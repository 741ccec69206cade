package cuda

import (
	"reflect"
	"testing"

	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// Entries lists every func field of the table exactly once, so the loader
// cannot leave a field nil.
func TestTableEntriesCoverEveryField(t *testing.T) {
	var tbl driver.Table
	seen := map[uintptr]string{}
	for _, e := range tbl.Entries() {
		v := reflect.ValueOf(e.Field)
		if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Func {
			t.Fatalf("%s: field is %T, not a pointer to a func", e.Symbols[0], e.Field)
		}
		if prev, dup := seen[v.Pointer()]; dup {
			t.Errorf("%s and %s bind the same field", prev, e.Symbols[0])
		}
		seen[v.Pointer()] = e.Symbols[0]
	}
	rt := reflect.TypeOf(tbl)
	funcs := 0
	for i := range rt.NumField() {
		if rt.Field(i).Type.Kind() == reflect.Func {
			funcs++
		}
	}
	if funcs != len(seen) {
		t.Errorf("the table has %d func fields, Entries lists %d", funcs, len(seen))
	}
}
