package pmm

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// Options configure a Manager.
type Options struct {
	// Verify turns on the checked wrapper's truthfulness checks (committed
	// bytes must move by exactly the rounded amount on every commit and
	// decommit). It costs a query per call; tests and demos turn it on.
	Verify bool
	// RecordSites keeps the stack each Buffer, Region and Shared was made
	// on (ep.Site), so that a report of a leaked or stuck handle names the
	// line that made it (ep.Lifecycle.Origin): one stack walk and one
	// allocation per handle when on (memgentest turns it on), nothing when
	// off.
	RecordSites bool
}

// Device describes one registered device.
type Device struct {
	Key       memapi.DeviceKey
	Mechanism memapi.Mechanism // bare; the manager wraps it with checked.Wrap
	Context   *ep.Context
	Authority memapi.AuthorityID
}

type device struct {
	key       memapi.DeviceKey
	ctx       *ep.Context
	authority memapi.AuthorityID
	mech      memapi.Mechanism     // checked wrapper over the current mechanism, trusting the manager's governor
	info      memapi.MechanismInfo // mech.Info(), which a checked wrapper fixes when it is built
	public    memapi.Mechanism     // checked wrapper over it that takes no grant: what Mechanism hands out
	bare      memapi.Mechanism
	gen       uint64 // bumped by Replace
}

// Manager is the ProcessMemoryManager.
type Manager struct {
	g    *governor.Governor // draws every grant; its wrappers accept only the governor's grants and accounts
	opts Options

	mu       sync.RWMutex
	devices  map[memapi.DeviceKey]*device
	bindings map[*Binding]struct{} // open bindings
	closed   bool
}

// New returns a manager that draws capacity from g: every grant it uses is
// the governor's, and the checked wrappers it builds accept only the
// governor's grants and accounts (g is their checked.Ledger).
func New(g *governor.Governor, opts Options) *Manager {
	return &Manager{g: g, opts: opts, devices: map[memapi.DeviceKey]*device{}, bindings: map[*Binding]struct{}{}}
}

// wrap returns the manager's checked wrapper over mech, which only the
// manager's own calls reach, and the one Mechanism hands out, which accepts
// no grant or account at all: nothing public yields a way to draw from or
// refund to the governor past the manager, nor the raw mechanism.
func (m *Manager) wrap(mech memapi.Mechanism) (own, public memapi.Mechanism) {
	var opts []checked.Option
	if m.opts.Verify {
		opts = append(opts, checked.WithVerify())
	}
	return checked.Wrap(mech, m.g.Ledger(), opts...), checked.Wrap(mech, checked.NoLedger)
}

// Register adds a device. Its mechanism's authority must be the device's,
// and the governor must have it: otherwise Register fails with an error of
// kind governor.ErrUnknown.
func (m *Manager) Register(d Device) error {
	if d.Mechanism == nil || d.Context == nil {
		return memapi.Errorf("pmm.Register", memapi.ErrInvalidSize, "device %v needs a mechanism and a context", d.Key)
	}
	if a := d.Mechanism.Info().Authority; a != d.Authority {
		return &memapi.Error{Op: "pmm.Register", Kind: memapi.ErrAuthorityMismatch, Authority: d.Authority,
			Detail: fmt.Sprintf("mechanism accounts to %q", a)}
	}
	if err := m.knownAuthority("pmm.Register", d.Key, d.Authority); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.devices[d.Key]; ok {
		return memapi.Errorf("pmm.Register", memapi.ErrInUse, "device %v is already registered", d.Key)
	}
	own, public := m.wrap(d.Mechanism)
	m.devices[d.Key] = &device{key: d.Key, ctx: d.Context, authority: d.Authority, mech: own, info: own.Info(), public: public, bare: d.Mechanism}
	return nil
}

// Replace installs a new mechanism for a registered device. New allocations
// use it; handles made by the old one are still released by the old one.
func (m *Manager) Replace(key memapi.DeviceKey, mech memapi.Mechanism) error {
	if mech == nil {
		return memapi.Errorf("pmm.Replace", memapi.ErrInvalidSize, "nil mechanism")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.devices[key]
	if !ok {
		return memapi.Errorf("pmm.Replace", memapi.ErrInvalidRange, "device %v is not registered", key)
	}
	if a := mech.Info().Authority; a != d.authority {
		return &memapi.Error{Op: "pmm.Replace", Kind: memapi.ErrAuthorityMismatch, Authority: d.authority,
			Detail: fmt.Sprintf("mechanism accounts to %q", a)}
	}
	nd := *d
	own, public := m.wrap(mech)
	nd.mech, nd.info, nd.public, nd.bare, nd.gen = own, own.Info(), public, mech, d.gen+1
	m.devices[key] = &nd
	return nil
}

func (m *Manager) device(op string, key memapi.DeviceKey) (*device, error) {
	m.mu.RLock()
	d, ok := m.devices[key]
	m.mu.RUnlock()
	if !ok {
		return nil, memapi.Errorf(op, memapi.ErrInvalidRange, "device %v is not registered", key)
	}
	return d, nil
}

// Mechanism returns what the device's current mechanism is, for inspection
// (Info, Negotiate, the queries); it is a checked wrapper built with
// checked.NoLedger, never the raw allocator: every consuming and refunding
// call through it fails with memapi.ErrForeignGrant, whatever grant it is
// given, and rewrapping it cannot widen that. Memory is obtained through a
// Binding.
func (m *Manager) Mechanism(key memapi.DeviceKey) (memapi.Mechanism, error) {
	d, err := m.device("pmm.Mechanism", key)
	if err != nil {
		return nil, err
	}
	return d.public, nil
}

// knownAuthority refuses an authority the governor does not have.
func (m *Manager) knownAuthority(op string, key memapi.DeviceKey, id memapi.AuthorityID) error {
	if _, ok := m.g.Authority(id); !ok {
		return &memapi.Error{Op: op, Kind: governor.ErrUnknown, Authority: id,
			Detail: fmt.Sprintf("device %v accounts to %q, which the governor does not have (add it first: governor.AddAuthority)", key, id)}
	}
	return nil
}

// Bind returns a scoped binding of holder in role to a device. It fails
// with an error of kind governor.ErrUnknown when the device's
// authority is gone from the governor (see Register).
func (m *Manager) Bind(holder, role string, key memapi.DeviceKey, opts ...BindOption) (*Binding, error) {
	d, err := m.device("pmm.Bind", key)
	if err != nil {
		return nil, err
	}
	if err := m.knownAuthority("pmm.Bind", key, d.authority); err != nil {
		return nil, err
	}
	b := &Binding{m: m, holder: holder, role: role, key: key}
	for _, o := range opts {
		o(b)
	}
	b.req = governor.Request{Holder: governor.HolderID(holder), Role: role, Priority: b.priority}
	b.bufName = holder + "/" + role + " buffer"
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, memapi.Errorf("pmm.Bind", memapi.ErrClosed, "manager is closed")
	}
	m.bindings[b] = struct{}{}
	return b, nil
}

// Close ends the manager: new bindings fail with memapi.ErrClosed, every
// open binding is closed, and the releases already queued on every device
// context are waited for (bounded by ctx). It frees nothing underneath a
// live handle: a binding that still has live handles stays open, and the
// error, of kind memapi.ErrInUse, says which, with every device context's
// allocations still alive and quarantined. Quarantined releases are
// retried first, including the leftovers of failed rollbacks that a
// closed context keeps unpinned (ep.Context.OwnQuarantined); one still
// failing makes the error of kind ep.ErrQuarantined when nothing else is
// alive, its bytes still booked in the governor. Close may be called again
// once the holders closed their handles or the faults cleared.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true
	bs := make([]*Binding, 0, len(m.bindings))
	for b := range m.bindings {
		bs = append(bs, b)
	}
	devs := make([]*device, 0, len(m.devices))
	for _, d := range m.devices {
		devs = append(devs, d)
	}
	m.mu.Unlock()
	var errs []error
	for _, b := range bs {
		errs = append(errs, b.Close())
	}
	seen := map[*ep.Context]bool{}
	for _, d := range devs {
		if seen[d.ctx] {
			continue
		}
		seen[d.ctx] = true
		errs = append(errs, d.ctx.RetryQuarantined())
		if err := d.ctx.Queue().Drain(ctx); err != nil {
			errs = append(errs, err)
			continue
		}
		if n, q := d.ctx.Live(), d.ctx.Quarantined(); n > 0 || q > 0 {
			kind := memapi.ErrInUse
			if n == 0 { // only leftovers the closed context keeps unpinned
				kind = ep.ErrQuarantined
			}
			errs = append(errs, &memapi.Error{Op: "pmm.Manager.Close", Kind: kind,
				Detail: fmt.Sprintf("device %v: %d allocation(s) still alive, %d quarantined", d.key, n, q),
				Err:    errors.Join(d.ctx.QuarantineErrors()...)})
		}
	}
	return errors.Join(errs...)
}

// BindOption configures a Binding.
type BindOption func(*Binding)

// WithPriority sets the priority the binding's reservations carry.
func WithPriority(p int) BindOption { return func(b *Binding) { b.priority = p } }
