package pmm

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
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
	req      governor.Request // what each of its reservations asks: its holder, role and priority (Authority and Bytes set per call)
	bufName  string           // its Buffers' label: "holder/role buffer" (the name adds the address)

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

// Authority returns the authority of the binding's device: the governor's
// ledger its memory is charged on.
func (b *Binding) Authority() (memapi.AuthorityID, error) {
	d, err := b.m.device("pmm.Binding.Authority", b.key)
	if err != nil {
		return "", err
	}
	return d.authority, nil
}

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
	b.m.mu.Lock()
	delete(b.m.bindings, b)
	b.m.mu.Unlock()
	return nil
}

// begin counts a new handle of the binding live, before one of its
// constructors makes it on the device returned (the one registered now);
// the constructor calls release when it fails. The handle's lifecycle
// uncounts it when it is closed (ep.Releaser.Closed), by Close or by the
// leak backstop.
func (b *Binding) begin(op string) (*device, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, memapi.Errorf(op, memapi.ErrClosed, "binding of holder %s is closed", b.holder)
	}
	b.live++
	b.mu.Unlock()
	b.m.mu.RLock()
	d := b.m.devices[b.key]
	b.m.mu.RUnlock()
	if d == nil {
		b.release()
		return nil, memapi.Errorf(op, memapi.ErrInvalidRange, "device %v is not registered", b.key)
	}
	return d, nil
}

func (b *Binding) release() {
	b.mu.Lock()
	b.live--
	b.mu.Unlock()
}

// cancel returns a grant after a failed step, joining any failure to err.
// A grant whose cancel fails is not dropped: it stays reserved (visible),
// and is kept on d's context as a leftover named name, like a failed
// rollback's, so that ep.Context.RetryQuarantined or Manager.Close cancels
// it once the fault clears; the error is then of kind ep.ErrQuarantined and
// wraps both failures.
func cancel(d *device, name string, g governor.Grant, err error) error {
	cerr := g.Cancel()
	if cerr == nil {
		return err
	}
	qerr := &memapi.Error{Op: "pmm.cancel", Kind: ep.ErrQuarantined, Authority: g.Authority(), Wanted: g.Size(),
		Detail: "the grant could not be cancelled; it stays reserved until a retry (ep.Context.RetryQuarantined, Manager.Close) cancels it", Err: errors.Join(err, cerr)}
	return keep(d, name+" (failed cancel)", &leftover{g: g, freed: true}, qerr)
}

// Buffer is an owning handle of ordinary memory. Record the fences of device
// work that uses it (RecordUse, which fails with memapi.ErrReleased once the
// release is scheduled); Close schedules its release behind them and
// returns without waiting for the device: the memory is freed once they
// completed, then refunded. Its lifecycle is ep.Lifecycle's (State): open,
// pending once closed, released once freed, or quarantined when the free
// failed (Err, of kind ep.ErrQuarantined), its bytes still charged, until
// Retry or Close frees them; a second Close of a buffer not quarantined
// returns nil. These methods are ep.Owned's.
type Buffer struct {
	ep.Owned
	addr memapi.DeviceAddr
	size memapi.Bytes
}

// Addr returns the buffer's device address.
func (b *Buffer) Addr() memapi.DeviceAddr { return b.addr }

// Size returns the buffer's size, rounded to the allocation granularity: the
// bytes charged.
func (b *Buffer) Size() memapi.Bytes { return b.size }

// Allocate obtains size bytes: reserve a grant, allocate through the checked
// wrapper (which draws from it), commit the grant into a lease, and return
// an owning Buffer. Any failure returns the grant and leaves no trace.
//
// When the bytes do not fit, the reservation waits (while the governor asks
// holders to reclaim) until ctx ends; a ctx with no deadline
// (context.Background()) waits at most the governor's
// governor.Options.DefaultWait, 30 s unless set, and then fails with an
// *governor.OverBudgetError whose cause is context.DeadlineExceeded
// (errors.Is(err, memapi.ErrOverBudget) holds).
func (b *Binding) Allocate(ctx context.Context, size memapi.Bytes) (*Buffer, error) {
	const op = "pmm.Allocate"
	var site *ep.Site
	if b.m.opts.RecordSites {
		site = new(ep.Site)
		runtime.Callers(2, site[:])
	}
	d, err := b.begin(op)
	if err != nil {
		return nil, err
	}
	// From here on the handle is counted live: every failure uncounts it
	// (release) before it returns.
	mech := d.mech
	n, ok := memapi.RoundUp(size, d.info.AllocGranularity)
	if size == 0 || !ok {
		b.release()
		return nil, &memapi.Error{Op: op, Kind: memapi.ErrInvalidSize, Wanted: size}
	}
	r := b.req
	r.Authority, r.Bytes = d.authority, n
	g, err := b.m.g.Reserve(ctx, r)
	if err != nil {
		b.release()
		return nil, err
	}
	a, err := mech.Allocate(ctx, memapi.AllocRequest{Size: size}, g)
	if err != nil {
		b.release()
		return nil, cancel(d, fmt.Sprintf("%s/%s grant of %d bytes", b.holder, b.role, n), g, err)
	}
	lease, err := g.Commit()
	if err != nil {
		b.release()
		if ferr := mech.Free(ctx, a, g); ferr != nil {
			free := func(ctx context.Context, acct memapi.Account) error { return mech.Free(ctx, a, acct) }
			return nil, keepRollback(d, fmt.Sprintf("%s/%s allocation %#x (failed rollback)", b.holder, b.role, a.Addr()), g, a.Size(), free, errors.Join(err, ferr))
		}
		return nil, cancel(d, fmt.Sprintf("%s/%s allocation %#x", b.holder, b.role, a.Addr()), g, err)
	}
	// The release holds the allocation, never the Buffer: the leak
	// backstop watches the Buffer.
	rel := &bufferRelease{b: b, mech: mech, a: a, lease: lease}
	buf := &Buffer{addr: a.Addr(), size: a.Size()}
	if err := d.ctx.OwnIn(&buf.Owned, b.bufName, rel, ep.Origin{Bytes: a.Size(), Addr: uint64(a.Addr()), Site: site}); err != nil {
		b.release()
		if ferr := rel.Free(ctx); ferr != nil {
			return nil, keepRefused(d, fmt.Sprintf("%s %#x (refused)", b.bufName, a.Addr()), rel, a.Size(), errors.Join(err, ferr))
		}
		return nil, err
	}
	return buf, nil
}

// bufferRelease is a Buffer's ep.Releaser.
type bufferRelease struct {
	b     *Binding
	mech  memapi.Mechanism
	a     *memapi.Allocation
	lease governor.Lease
	quar  bool // set by a failed free, read by its retry (both ordered by the lifecycle)
}

func (r *bufferRelease) Closed()  { r.b.release() }
func (r *bufferRelease) Pending() { _ = r.lease.MarkPending(r.a.Size()) }

func (r *bufferRelease) Free(ctx context.Context) error {
	acct := memapi.Account(r.lease)
	if r.quar {
		acct = r.lease.QuarantinedAccount()
	}
	err := r.mech.Free(ctx, r.a, acct)
	if r.quar && errors.Is(err, memapi.ErrReleased) {
		// The memory of a buffer quarantined by a free whose refund
		// failed is already freed: only the refund is left.
		return acct.Refund(r.a.Size())
	}
	if err != nil && !r.quar {
		r.quar = r.lease.Quarantine(r.a.Size()) == nil
	}
	return err
}

// keepRollback books backing whose rollback failed after its grant could not
// commit: the drawn bytes stay in the open grant (reserved, visible), and the
// leftover is quarantined on the device context (pinning it, or unpinned
// when the context is closing: ep.Context.OwnQuarantined), so that
// ep.Context.RetryQuarantined or Manager.Close frees it back into the grant
// and cancels the grant once the fault clears. The error is of kind
// ep.ErrQuarantined.
func keepRollback(d *device, name string, g governor.Grant, n memapi.Bytes, free func(context.Context, memapi.Account) error, err error) error {
	qerr := &memapi.Error{Op: "pmm.rollback", Kind: ep.ErrQuarantined, Authority: g.Authority(), Wanted: n,
		Detail: "rollback failed; the grant keeps the bytes drawn until a retry (ep.Context.RetryQuarantined, Manager.Close) frees them", Err: err}
	return keep(d, name, &leftover{g: g, free: free}, qerr)
}

// keepRefused books memory whose lease is committed but which the context
// refused to own (it is closing) and which could not be freed either: rel's
// failed Free booked its bytes quarantined in the lease (charged,
// visible), and rel is kept on the context (ep.Context.OwnQuarantined), so
// that ep.Context.RetryQuarantined or Manager.Close frees it and refunds
// the quarantined bytes once the fault clears. The error is of kind
// ep.ErrQuarantined and wraps memapi.ErrClosed.
func keepRefused(d *device, name string, rel ep.Releaser, n memapi.Bytes, err error) error {
	qerr := &memapi.Error{Op: "pmm.own", Kind: ep.ErrQuarantined, Authority: d.authority, Wanted: n,
		Detail: "the context refused the new handle and its memory could not be freed; it stays charged, quarantined, until a retry (ep.Context.RetryQuarantined, Manager.Close) frees it", Err: err}
	return keep(d, name, rel, qerr)
}

// keep hands a leftover to the device context for a retry; err is the
// caller's error, joined with the context's should it refuse even that.
func keep(d *device, name string, rel ep.Releaser, err error) error {
	if _, kerr := d.ctx.OwnQuarantined(name, rel, err); kerr != nil {
		return errors.Join(err, kerr)
	}
	return err
}

// leftover is the ep.Releaser of backing a failed rollback left drawn from
// an open grant: free it into the grant (which undraws), then cancel the
// grant. A retry after a failed cancel only cancels.
type leftover struct {
	g     governor.Grant
	free  func(context.Context, memapi.Account) error
	freed bool // set by a successful free, read by the retry (both ordered by the lifecycle)
}

func (l *leftover) Closed()  {}
func (l *leftover) Pending() {}

func (l *leftover) Free(ctx context.Context) error {
	if !l.freed {
		if err := l.free(ctx, l.g); err != nil {
			return err
		}
		l.freed = true
	}
	return l.g.Cancel()
}
