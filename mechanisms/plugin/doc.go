// Package plugin loads memory mechanisms written in C, C++ or Rust against
// the plugin C ABI: the header include/memgen/mechanism.h, which memgen
// generates from the plugin_abi block of spec/capabilities.yaml together
// with this package's Go mirrors of its structs (zz_generated.abi.go).
//
// Open dlopens a plugin through purego (no cgo), calls its entry point
// memgen_plugin_v1 with this host's ABI version and validates what it
// returns: the descriptor's major must be this host's, its struct_size large
// enough, its name and device declared in the spec. Every struct of slots is
// read only up to the plugin's struct_size, and slots newer than the
// plugin's minor are cleared, so a plugin built against an older minor loads
// with fewer capabilities and one built against a newer minor loads with its
// extra slots ignored. A capability with any slot missing is absent.
//
// Library.New opens an instance and presents it as a memapi.Mechanism;
// Mechanism.NewContext gives the device context made of the plugin's stream
// and fence slots. The Go side keeps the contract's handles (nil, foreign
// and released handles never reach the plugin) and checks what the plugin
// returns (ErrProtocol for an undeclared status, a reused id, a short
// allocation); plugins never see grants, and checked.Wrap draws and refunds
// around every call as for any mechanism.
//
//	m, err := plugin.New("libvendor.so", plugin.Options{})
//	dc, err := m.NewContext()
//	mech := checked.Wrap(m, gov) // accepts only the governor's grants
//
// A fault inside a C slot cannot be contained in-process; a panic on the Go
// side of a call is. docs/cabi.md is the guide to writing a plugin, with the
// reference plugin (testdata/refhost.c) as the worked example.
package plugin
