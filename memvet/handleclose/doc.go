// Package handleclose defines an Analyzer that checks that every owning
// handle of device memory is closed or handed on along every path.
//
// # Analyzer handleclose
//
// handleclose: report owning handles (spec ownership.handles) that are not
// closed, returned, stored or passed on along every path
//
// The owning handles are the types the spec's ownership section names
// (pmm.Buffer, pmm.Region, pmm.Shared, ep.Owned today), each with the
// method that ends its ownership (Close). A handle returned by a call is
// reported when it is discarded (assigned to _, or the call used as a
// statement), or when it is assigned to a local variable and some path of
// the function's control-flow graph from the call reaches a return with
// the handle neither closed nor let go of: returned, stored in a field, a
// slice, a map or another variable, passed to a call, sent on a channel,
// or captured by a closure. A handle never closed is never released: its
// memory stays charged until the leak backstop, which is not the normal
// path, finds it.
//
// The walk knows which error variables are nil along a path: the error
// that came with the handle starts out nil (where it is not, the handle is
// nil), so the usual
//
//	buf, err := bind.Allocate(ctx, n)
//	if err != nil {
//		return err
//	}
//
// is not a leak. This one is, on the path where the upload fails:
//
//	buf, err := bind.Allocate(ctx, n) // the pmm.Buffer buf is not closed, returned, stored or passed on along every path
//	if err != nil {
//		return err
//	}
//	if err := upload(ctx, buf.Addr(), data); err != nil {
//		return err // buf lost
//	}
//	s.weights = append(s.weights, buf)
//
// Where it is plain (nothing in the function lets the handle go, it is
// defined with :=, and the next statement is the error check or there is
// no error), a suggested fix inserts defer buf.Close() after the check.
//
// See docs/memvet.md for the analysis' limits.
package handleclose
