// Package recorduse defines an Analyzer that checks that device work on an
// owning handle's memory is covered by a fence recorded on the handle.
//
// # Analyzer recorduse
//
// recorduse: report stream work on an owning handle's address after which
// some path returns without RecordUse on the handle or a Synchronize of the
// stream
//
// Device work is a method of the spec's stream role that takes a device
// address (CopyToDevice, CopyFromDevice, CopyDevice). When its address is
// written as h.Addr() (plus an offset) with h an owning handle, and some
// path from the submission reaches a return with neither h.RecordUse(...),
// nor a Synchronize of that stream, nor h handed on (returned, passed,
// stored), the submission is reported: without the fence, the handle's
// Close may free the memory while the copy still runs. A submission whose
// error is tested is followed only where it succeeded.
//
//	func (s *Server) Refresh(i int, data []byte) error {
//		return s.st.CopyToDevice(s.weights[i].Addr(), data) // device work ... is submitted here, and the return ... is reached without RecordUse
//	}
//
// It is narrow on purpose, so that it has no false positives: work on an
// address passed in as a memapi.DeviceAddr is not tied to any handle, and
// it checks that a RecordUse on the same handle expression follows, not
// which fence it records. See docs/memvet.md.
package recorduse
