// Package leaks is a downstream package that takes owning handles from a
// binding and sometimes loses them.
package leaks

import (
	"context"
	"errors"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

var ctx = context.Background()

// Leaks.

func discarded(b *pmm.Binding) {
	b.Allocate(ctx, 1)              // want `the pmm.Buffer returned here is discarded: Close it`
	_, _ = b.ReserveVirtual(ctx, 1) // want `the pmm.Region returned by this call is discarded`
}

func neverClosed(b *pmm.Binding) error {
	buf, err := b.Allocate(ctx, 1) // want `the pmm.Buffer buf is not closed, returned, stored or passed on along every path: the return at line 28 is reached with it open`
	if err != nil {
		return err
	}
	_ = buf.Addr()
	return nil
}

func earlyReturn(b *pmm.Binding, f memapi.Fence) error {
	r, err := b.ReserveVirtual(ctx, 1<<20) // want `the pmm.Region r is not closed`
	if err != nil {
		return err
	}
	if err := r.RecordUse(f); err != nil {
		return err // the region is lost here
	}
	return r.Close()
}

func reusedErr(b *pmm.Binding, check func(memapi.Bytes) error) error {
	s, err := b.CreateShared(ctx, 1<<20) // want `the pmm.Shared s is not closed`
	if err != nil {
		return err
	}
	err = check(s.Size())
	if err != nil {
		return err // err is not the allocation's any more: s leaks
	}
	return s.Close()
}

func inLoop(b *pmm.Binding, n int) error {
	for range n {
		buf, err := b.Allocate(ctx, 1) // want `the pmm.Buffer buf is not closed`
		if err != nil {
			return err
		}
		if buf.Size() == 0 {
			continue
		}
		buf.Close()
	}
	return nil
}

func varDecl(b *pmm.Binding) {
	var buf, _ = b.Allocate(ctx, 1) // want `the pmm.Buffer buf is not closed`
	_ = buf.Size()
}

// Handles that are closed, returned, stored or passed on.

func deferred(b *pmm.Binding) error {
	buf, err := b.Allocate(ctx, 1)
	if err != nil {
		return err
	}
	defer buf.Close()
	return nil
}

func returned(b *pmm.Binding) (*pmm.Buffer, error) {
	buf, err := b.Allocate(ctx, 1)
	if err != nil {
		return nil, err
	}
	if buf.Size() == 0 {
		return nil, errors.Join(errors.New("empty"), buf.Close())
	}
	return buf, nil
}

type pool struct{ bufs []*pmm.Buffer }

func (p *pool) stored(b *pmm.Binding) error {
	buf, err := b.Allocate(ctx, 1)
	if err == nil {
		p.bufs = append(p.bufs, buf)
	}
	return err
}

func passedOn(b *pmm.Binding, sink func(*pmm.Region)) error {
	r, err := b.ReserveVirtual(ctx, 1<<20)
	if err != nil {
		return err
	}
	sink(r)
	return nil
}

func closedLater(b *pmm.Binding) (err error) {
	buf, err := b.Allocate(ctx, 1)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, buf.Close()) }()
	return nil
}

func stillOpenOnPanic(b *pmm.Binding) {
	buf, err := b.Allocate(ctx, 1)
	if err != nil {
		panic(err)
	}
	buf.Close()
}

// Branches on an error already tested are not taken both ways.
func correlated(b *pmm.Binding, old *pmm.Buffer, keep func(*pmm.Buffer)) error {
	nb, err := b.Allocate(ctx, 1)
	if err == nil {
		var closeErr error
		if closeErr = old.Close(); closeErr == nil {
			keep(nb)
		}
		if closeErr != nil {
			err = errors.Join(closeErr, nb.Close())
		}
	}
	return err
}

// errors.Is and errors.As branches carry an error, hence no handle.
func unsupportedFallback(b *pmm.Binding) (*pmm.Region, error) {
	r, err := b.ReserveVirtual(ctx, 1<<20)
	if errors.Is(err, errors.ErrUnsupported) {
		return nil, errors.New("no growable region here")
	}
	return r, err
}

// The escape, with its reason.
func leakOnPurpose(b *pmm.Binding) {
	//memvet:allow the cleanup backstop is what this exercises
	buf, _ := b.Allocate(ctx, 1)
	_ = buf.Addr()
}
