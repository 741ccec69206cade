// Package plugin loads memory mechanisms written in C, C++ or Rust against
// the plugin C ABI 2.0: the header include/memgen/mechanism.h, which memgen
// generates from the plugin_abi block of spec/capabilities.yaml together
// with this package's Go mirrors of its structs (zz_generated.abi.go).
//
// Open dlopens any plugin by path at run time through purego (no cgo),
// calls its entry point memgen_plugin_v2 with this host's ABI version and
// validates what it returns: the descriptor's major must be this host's, its
// struct_size large enough, its name and granularities well formed. The
// spec's plugin list is an optional allow-list (SpecAllowList). Every struct
// of slots is read only up to the plugin's struct_size, and slots newer than
// the plugin's minor are cleared. A capability with any slot missing is
// absent.
//
// Library.New opens an instance with a configuration string and presents it
// as a memapi.Mechanism; Mechanism.NewContext gives the device context made
// of the plugin's stream and fence slots. The host owns the handles: it
// assigns every id, keeps its own table, and turns an id the plugin changes
// or disowns into ErrProtocol with the bytes behind it quarantined. Verify
// mode audits used_bytes against that table after every call; consuming
// slots get a deadline and an overrun is reported (OverrunError); a failing
// slot's last_error message is in the error. Plugins never see grants, and
// checked.Wrap draws and refunds around every call as for any mechanism.
// Options.Faults (a memapi.Injector) fails chosen slot calls before they are
// made, as if the plugin had returned the status, to test the host's and
// its callers' handling of a plugin's failures.
//
//	m, err := plugin.New("./libvendor.so", plugin.Options{Verify: true})
//	dc, err := m.NewContext()
//	mech := checked.Wrap(m, gov.Ledger()) // accepts only the governor's grants
//
// Every call into the plugin goes through runtime.cgocall (set up without
// cgo by purego): on amd64 with a trampoline that loads a slot's at most six
// integer arguments into registers (call_amd64.s), elsewhere through
// purego.SyscallN. A fault inside a C slot cannot be contained in-process; a
// panic on the Go side of a call is. For a process that runs a plugin on its
// own (memgen plugin-check's child), Options.GuardPages makes a write past a
// buffer fault at once and Options.Watchdog reports a call that does not
// return. docs/cabi.md is the guide to writing a plugin, with a complete
// minimal one (testdata/minimal.c) and memgen plugin-check.
package plugin
