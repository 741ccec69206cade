package pmm

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
)

// Binding is a holder's scoped access to one device in one role. It carries
// the device, the mechanism selection, the context and the authority; it
// never exposes a raw allocator.
type Binding struct {
	m        *Manager
	holder   string
	role     string
	key      memapi.DeviceKey
	priority int

	mu     sync.Mutex
	live   int
	closed bool
}

// Holder returns the binding's holder.
func (b *Binding) Holder() string { return b.holder }

// Role returns the binding's role.
func (b *Binding) Role() string { return b.role }

// Device returns the binding's device.
func (b *Binding) Device() memapi.DeviceKey { return b.key }

// Live returns the handles made through the binding and not yet closed.
func (b *Binding) Live() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.live
}

// Capabilities reports what the device's current mechanism offers. It is
// resolved on every call (invariant no-stale-capability).
func (b *Binding) Capabilities() (memapi.CapSet, error) {
	d, err := b.m.device("pmm.Binding.Capabilities", b.key)
	if err != nil {
		return 0, err
	}
	return memapi.Negotiate(d.mech), nil
}

// Close ends the binding. With live handles it fails with an error of kind
// memapi.ErrInUse and frees nothing.
func (b *Binding) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	if b.live > 0 {
		return &memapi.Error{Op: "pmm.Binding.Close", Kind: memapi.ErrInUse,
			Detail: fmt.Sprintf("holder %s (%s) still has %d live handle(s)", b.holder, b.role, b.live)}
	}
	b.closed = true
	return nil
}

// counted runs make, one of the binding's constructors, on the device
// resolved now, with the new handle counted live; a failure uncounts it.
func counted[T any](b *Binding, op string, make func(*device) (T, error)) (T, error) {
	var zero T
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return zero, memapi.Errorf(op, memapi.ErrClosed, "binding of holder %s is closed", b.holder)
	}
	b.live++
	b.mu.Unlock()
	d, err := b.m.device(op, b.key)
	if err != nil {
		b.release()
		return zero, err
	}
	v, err := make(d)
	if err != nil {
		b.release()
		return zero, err
	}
	return v, nil
}

func (b *Binding) release() {
	b.mu.Lock()
	b.live--
	b.mu.Unlock()
}

func (b *Binding) reserve(ctx context.Context, d *device, n memapi.Bytes) (Grant, error) {
	return b.m.ledger.Reserve(ctx, Request{Authority: d.authority, Holder: b.holder, Role: b.role, Bytes: n, Priority: b.priority})
}

// cancel returns a grant after a failed step, joining any failure to err.
func cancel(g Grant, err error) error {
	if cerr := g.Cancel(); cerr != nil {
		return errors.Join(err, cerr)
	}
	return err
}

// Buffer is an owning handle of ordinary memory. Record the fences of device
// work that uses it; Close schedules its release behind them.
type Buffer struct {
	*ep.Owned
	bind *Binding
	once sync.Once
	addr memapi.DeviceAddr
	size memapi.Bytes
}

// Close schedules the release behind the recorded fences and returns at
// once; the lease is pending-free until the mechanism really freed the
// memory. It is idempotent.
func (x *Buffer) Close() error {
	err := x.Owned.Close()
	if err == nil {
		x.once.Do(x.bind.release)
	}
	return err
}

// Addr returns the buffer's device address.
func (b *Buffer) Addr() memapi.DeviceAddr { return b.addr }

// Size returns the buffer's size, rounded to the allocation granularity: the
// bytes charged.
func (b *Buffer) Size() memapi.Bytes { return b.size }

// Allocate obtains size bytes: reserve a grant, allocate through the checked
// wrapper (which draws from it), commit the grant into a lease, and return
// an owning Buffer. Any failure returns the grant and leaves no trace.
func (b *Binding) Allocate(ctx context.Context, size memapi.Bytes) (*Buffer, error) {
	return counted(b, "pmm.Allocate", func(d *device) (*Buffer, error) { return b.allocate(ctx, d, size) })
}

func (b *Binding) allocate(ctx context.Context, d *device, size memapi.Bytes) (*Buffer, error) {
	const op = "pmm.Allocate"
	mech := d.mech
	n, ok := memapi.RoundUp(size, mech.Info().AllocGranularity)
	if size == 0 || !ok {
		return nil, &memapi.Error{Op: op, Kind: memapi.ErrInvalidSize, Wanted: size}
	}
	g, err := b.reserve(ctx, d, n)
	if err != nil {
		return nil, err
	}
	a, err := mech.Allocate(ctx, memapi.AllocRequest{Size: size}, g)
	if err != nil {
		return nil, cancel(g, err)
	}
	lease, err := g.Commit()
	if err != nil {
		if ferr := mech.Free(ctx, a, g); ferr != nil {
			return nil, errors.Join(err, ferr)
		}
		return nil, cancel(g, err)
	}
	owned, err := d.ctx.Own(fmt.Sprintf("%s/%s buffer %#x", b.holder, b.role, a.Addr()),
		func() { _ = lease.MarkPending(a.Size()) },
		func(ctx context.Context) error { return mech.Free(ctx, a, lease) })
	if err != nil {
		return nil, errors.Join(err, mech.Free(ctx, a, lease))
	}
	return &Buffer{Owned: owned, bind: b, addr: a.Addr(), size: a.Size()}, nil
}
