// Package good is package bad corrected: the same server, and memvet finds
// nothing in it.
package good

import (
	"context"
	"errors"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// Server keeps model weights on one device.
type Server struct {
	bind    *pmm.Binding
	st      memapi.Stream
	weights []*pmm.Buffer
}

// New returns a server over the manager's binding.
func New(bind *pmm.Binding, st memapi.Stream) *Server {
	return &Server{bind: bind, st: st}
}

// Scratch takes workspace through the binding: reserve, allocate through
// the checked wrapper, commit, an owning handle.
func (s *Server) Scratch(ctx context.Context) (*pmm.Buffer, error) {
	return s.bind.Allocate(ctx, 1<<20)
}

// Freed reads the ledger's own figures instead of counting on the side.
func (s *Server) Live() int { return s.bind.Live() }

// Load uploads a weight; when the upload fails the buffer is closed.
func (s *Server) Load(ctx context.Context, data []byte) error {
	buf, err := s.bind.Allocate(ctx, memapi.Bytes(len(data)))
	if err != nil {
		return err
	}
	if err := s.upload(ctx, buf.Addr(), data); err != nil {
		return errors.Join(err, buf.Close())
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

// Refresh rewrites a weight in place and records the copy's fence on the
// buffer, so that Evict's release waits for it.
func (s *Server) Refresh(i int, data []byte) error {
	buf := s.weights[i]
	if err := s.st.CopyToDevice(buf.Addr(), data); err != nil {
		return err
	}
	f, err := s.st.Record()
	if err != nil {
		return errors.Join(err, s.st.Synchronize(context.Background()))
	}
	return buf.RecordUse(f)
}

// Evict closes a weight.
func (s *Server) Evict(i int) error {
	buf := s.weights[i]
	s.weights = append(s.weights[:i], s.weights[i+1:]...)
	return buf.Close()
}

// Grow reserves a growable cache where the device offers VirtualBacking,
// and says so where it does not: the caller falls back to Scratch.
func (s *Server) Grow(ctx context.Context, max memapi.Bytes) (*pmm.Region, error) {
	r, err := s.bind.ReserveVirtual(ctx, max)
	if errors.Is(err, errors.ErrUnsupported) {
		return nil, errors.Join(errors.New("no growable cache on this device; use Scratch"), err)
	}
	return r, err
}

// Capabilities negotiates before it touches an optional capability.
func Capabilities(m memapi.Mechanism) (memapi.Bytes, error) {
	vb, err := memapi.RequireVirtualBacking(m)
	if err != nil {
		return 0, err
	}
	res, err := vb.Reserve(context.Background(), memapi.ReserveRequest{Size: 1})
	if err != nil {
		return 0, err
	}
	return res.Size(), nil
}
