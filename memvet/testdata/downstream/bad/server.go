// Package bad is a downstream serving program written without memvet: each
// function carries one mistake, and the comment "finding: NAME" on a line
// names the analyzer that must report it there. Package good is the same
// program corrected, and memvet finds nothing in it.
package bad

import (
	"context"
	"errors"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// Server keeps model weights on one device.
type Server struct {
	mech    memapi.Mechanism // the device's mechanism, kept "to save a wrapper"
	bind    *pmm.Binding
	st      memapi.Stream
	weights []*pmm.Buffer
	freed   memapi.Bytes
}

// New returns a server over the manager's binding and a raw mechanism.
func New(mech memapi.Mechanism, bind *pmm.Binding, st memapi.Stream) *Server {
	return &Server{mech: mech, bind: bind, st: st}
}

// Scratch takes workspace straight from the mechanism: nothing draws the
// grant, and a failure undraws nothing.
func (s *Server) Scratch(ctx context.Context, g memapi.Grant) (*memapi.Allocation, error) {
	return s.mech.Allocate(ctx, memapi.AllocRequest{Size: 1 << 20}, g) // finding: nobypass
}

// counter counts refunds on the side: an account the ledger never issued.
type counter struct{ s *Server } // finding: nobypass

func (c counter) Authority() memapi.AuthorityID { return "" }
func (c counter) Refund(n memapi.Bytes) error   { c.s.freed += n; return nil }

// Load uploads a weight; when the upload fails the buffer is lost.
func (s *Server) Load(ctx context.Context, data []byte) error {
	buf, err := s.bind.Allocate(ctx, memapi.Bytes(len(data))) // finding: handleclose
	if err != nil {
		return err
	}
	if err := s.upload(ctx, buf.Addr(), data); err != nil {
		return err
	}
	s.weights = append(s.weights, buf)
	return nil
}

func (s *Server) upload(ctx context.Context, addr memapi.DeviceAddr, data []byte) error {
	if err := s.st.CopyToDevice(addr, data); err != nil {
		return err
	}
	return s.st.Synchronize(ctx)
}

// Refresh rewrites a weight in place and lets the next step go on; nothing
// keeps Evict from freeing the buffer under the copy.
func (s *Server) Refresh(i int, data []byte) error {
	return s.st.CopyToDevice(s.weights[i].Addr(), data) // finding: recorduse
}

// Evict closes a weight.
func (s *Server) Evict(i int) error {
	buf := s.weights[i]
	s.weights = append(s.weights[:i], s.weights[i+1:]...)
	return buf.Close()
}

// Grow reserves a growable cache, assuming the device has VirtualBacking.
func (s *Server) Grow(ctx context.Context, max memapi.Bytes) (*memapi.Reservation, error) {
	vb, _ := memapi.RequireVirtualBacking(s.mech) // finding: unsupported
	return vb.Reserve(ctx, memapi.ReserveRequest{Size: max})
}

// Debug frees through the raw mechanism "because the wrapper was in the way".
func (s *Server) Debug(ctx context.Context, a *memapi.Allocation, to memapi.Account) error {
	/* finding: memvetallow */                  //memvet:allow
	return errors.Join(s.mech.Free(ctx, a, to)) // finding: nobypass
}
