package plugin_test

import (
	"errors"
	"fmt"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/plugin"
)

// A plugin built against include/memgen/mechanism.h alone is loaded by path,
// checked and used like any mechanism. (Not run: it needs a built plugin;
// outside_test.go builds one.)
func Example() {
	m, err := plugin.New("/usr/lib/memgen/librefhost.so", plugin.Options{Authority: "host", Config: "granularity=65536"})
	var le *plugin.LoadError
	switch {
	case errors.Is(err, plugin.ErrIncompatible):
		fmt.Println("built against another major of the ABI:", err)
		return
	case errors.As(err, &le):
		fmt.Println("refused:", le.Kind)
		return
	}
	defer m.Close()
	dc, err := m.NewContext() // the plugin's stream and fence slots
	if err != nil {
		return
	}
	defer dc.Close()
	mech := checked.Wrap(m, checked.NoLedger) // inspection only: this wrapper accepts no grant
	fmt.Println(memapi.Negotiate(mech), m.Library())
	if _, err := memapi.RequireSharedMapping(mech); err != nil {
		fmt.Println("no SharedMapping") // absent, never a no-op
	}
}
