// Package unsupported defines an Analyzer that checks that the answer of a
// capability negotiation is looked at before the capability is used.
//
// # Analyzer unsupported
//
// unsupported: report Require helpers whose error, and capability accessors
// whose ok, is ignored or read only after the capability is used
//
// An optional capability is absent on a mechanism that lacks it, never a
// successful no-op: memapi's Require helpers (RequireVirtualBacking, ...)
// return an error and its As accessors (AsVirtualBacking, ...) an ok that
// say so. Reported are the error or ok assigned to _ or the whole call used
// as a statement,
//
//	vb, _ := memapi.RequireVirtualBacking(s.mech) // the error of RequireVirtualBacking is ignored
//	return vb.Reserve(ctx, memapi.ReserveRequest{Size: max})
//
// and the capability used, on some path from the negotiation, before the
// error or ok is read:
//
//	vb, err := memapi.RequireVirtualBacking(m)
//	r, rerr := vb.Reserve(ctx, req) // vb is used before the error of RequireVirtualBacking is checked
//	if err != nil {
//
// Reading only the answer (_, ok := m.AsVirtualBacking()), passing both on
// (return vb, err) and passing the result straight to a call are fine. See
// docs/memvet.md.
package unsupported
