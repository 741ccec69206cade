package holders

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pmm"
)

// ResidencyConfig configures a Residency.
type ResidencyConfig struct {
	// Manager, Device and DeviceContext: where the weights live and the
	// context whose streams copy them.
	Manager       *pmm.Manager
	Device        memapi.DeviceKey
	DeviceContext memapi.DeviceContext
	// Host and HostContext: where offloaded weights go. Its authority must
	// differ from the device's (offloading into the pool that is short would
	// free nothing).
	Host        memapi.DeviceKey
	HostContext memapi.DeviceContext
	// Holder is the store's holder name in the governor (register the store
	// under it); default "weights". Role defaults to "weights"; host copies
	// are made in role Role+"-offload".
	Holder, Role string
	// Priority is carried by the store's reservations.
	Priority int
	// HotFor keeps weights used within this long resident under pressure
	// (0: only the order, coldest first, protects them).
	HotFor time.Duration
	// Clock returns the time (default time.Now).
	Clock func() time.Time
	// Staging is the chunk copies go through between the two contexts;
	// default 4 MiB.
	Staging memapi.Bytes
	// OffloadTimeout bounds one offload under a ticket (host allocation and
	// copy), so that a full host pool cannot hold the reservation that asked
	// for ever; the ticket's deadline bounds it too. Default 5s.
	OffloadTimeout time.Duration
}

// Residency is the reference model residency store: named weights as owning
// device buffers, offloaded to host memory under pressure, coldest first,
// and reloaded on demand. It implements governor.Holder and is safe for
// concurrent use.
type Residency struct {
	cfg       ResidencyConfig
	dev, host *pmm.Binding
	devAuth   memapi.AuthorityID

	mu      sync.Mutex
	seq     uint64
	weights map[string]*weight
	closed  bool
	stats   ResidencyStats
}

type weight struct {
	name    string
	size    memapi.Bytes // logical bytes
	pinned  bool
	dev     *pmm.Buffer // resident copy, or nil
	host    *pmm.Buffer // offloaded copy, or nil
	users   int
	moving  chan struct{} // non-nil while loaded, offloaded or reloaded; closed when done
	lastUse time.Time
	lastSeq uint64
}

// ResidencyStats are a Residency's figures.
type ResidencyStats struct {
	Weights, Resident, Offloaded  int
	ResidentBytes, OffloadedBytes memapi.Bytes // logical sizes

	Offloads, Reloads uint64
	OffloadedTotal    memapi.Bytes // bytes copied to the host by offloads
	ReloadedTotal     memapi.Bytes // bytes copied back by reloads
	Tickets           uint64       // pressure tickets answered
	Reclaimed         memapi.Bytes // device bytes reported freed to tickets
}

// WeightInfo describes one weight.
type WeightInfo struct {
	Name     string
	Size     memapi.Bytes
	Pinned   bool
	Resident bool
	Users    int
	InFlight bool // recorded fences not yet complete
	LastUse  time.Time
}

// NewResidency binds a residency store to its device and host.
func NewResidency(cfg ResidencyConfig) (*Residency, error) {
	const op = "holders.NewResidency"
	if cfg.Manager == nil || cfg.DeviceContext == nil || cfg.HostContext == nil {
		return nil, memapi.Errorf(op, memapi.ErrNilHandle, "need a manager, a device context and a host context")
	}
	if cfg.Holder == "" {
		cfg.Holder = "weights"
	}
	if cfg.Role == "" {
		cfg.Role = "weights"
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Staging == 0 {
		cfg.Staging = 4 << 20
	}
	if cfg.OffloadTimeout <= 0 {
		cfg.OffloadTimeout = 5 * time.Second
	}
	dm, err := cfg.Manager.Mechanism(cfg.Device)
	if err != nil {
		return nil, err
	}
	hm, err := cfg.Manager.Mechanism(cfg.Host)
	if err != nil {
		return nil, err
	}
	if dm.Info().Authority == hm.Info().Authority {
		return nil, &memapi.Error{Op: op, Kind: memapi.ErrAuthorityMismatch, Authority: dm.Info().Authority,
			Detail: "the host must account to another authority than the device"}
	}
	dev, err := cfg.Manager.Bind(cfg.Holder, cfg.Role, cfg.Device, pmm.WithPriority(cfg.Priority))
	if err != nil {
		return nil, err
	}
	host, err := cfg.Manager.Bind(cfg.Holder, cfg.Role+"-offload", cfg.Host, pmm.WithPriority(cfg.Priority))
	if err != nil {
		return nil, errors.Join(err, dev.Close())
	}
	return &Residency{cfg: cfg, dev: dev, host: host, devAuth: dm.Info().Authority, weights: map[string]*weight{}}, nil
}

// WeightSpec describes a weight to load.
type WeightSpec struct {
	Name   string
	Size   memapi.Bytes // 0: len(Data)
	Data   []byte       // written at the start of the weight; may be shorter than Size or nil
	Pinned bool         // never offloaded
}

// Load allocates a weight on the device and writes its data through the
// device context. The allocation may put the governor under pressure. On
// failure nothing of the weight remains.
func (r *Residency) Load(ctx context.Context, spec WeightSpec) error {
	const op = "holders.Residency.Load"
	size := spec.Size
	if size == 0 {
		size = memapi.Bytes(len(spec.Data))
	}
	if size == 0 || memapi.Bytes(len(spec.Data)) > size {
		return &memapi.Error{Op: op, Kind: memapi.ErrInvalidSize, Wanted: memapi.Bytes(len(spec.Data)), Available: spec.Size, Detail: "weight " + spec.Name}
	}
	w := &weight{name: spec.Name, size: size, pinned: spec.Pinned, moving: make(chan struct{})}
	r.mu.Lock()
	switch {
	case r.closed:
		r.mu.Unlock()
		return memapi.Errorf(op, memapi.ErrClosed, "residency store is closed")
	case r.weights[spec.Name] != nil:
		r.mu.Unlock()
		return memapi.Errorf(op, memapi.ErrInUse, "weight %q is already loaded", spec.Name)
	}
	r.weights[spec.Name] = w // holds the name while loading; Reclaim skips a moving weight
	r.mu.Unlock()

	buf, err := r.dev.Allocate(ctx, size)
	if err == nil && len(spec.Data) > 0 {
		if err = r.write(ctx, buf.Addr(), spec.Data); err != nil {
			err = errors.Join(err, buf.Close())
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	close(w.moving)
	w.moving = nil
	if err != nil {
		delete(r.weights, spec.Name)
		return err
	}
	w.dev = buf
	r.touchLocked(w)
	return nil
}

func (r *Residency) write(ctx context.Context, addr memapi.DeviceAddr, data []byte) error {
	st, err := r.cfg.DeviceContext.NewStream()
	if err != nil {
		return err
	}
	err = st.CopyToDevice(addr, data)
	if err == nil {
		err = st.Synchronize(ctx)
	}
	return errors.Join(err, st.Close())
}

func (r *Residency) touchLocked(w *weight) {
	r.seq++
	w.lastSeq = r.seq
	w.lastUse = r.cfg.Clock()
}

// WeightUse is a use of a resident weight: while it is open, and until the
// fences recorded on it complete, the weight is not offloaded.
type WeightUse struct {
	Addr memapi.DeviceAddr // the weight's device address for this use

	r    *Residency
	w    *weight
	buf  *pmm.Buffer
	once sync.Once
}

// RecordUse records the fence of device work that reads the weight: it is
// neither offloaded nor freed before the fence completes.
func (u *WeightUse) RecordUse(f memapi.Fence) error { return u.buf.RecordUse(f) }

// Done ends the use and marks the weight used now. It is idempotent.
func (u *WeightUse) Done() {
	u.once.Do(func() {
		u.r.mu.Lock()
		u.w.users--
		u.r.touchLocked(u.w)
		u.r.mu.Unlock()
	})
}

// Use returns a use of the named weight, reloading it from the host first
// when it was offloaded (which may put the governor under pressure and wait,
// bounded by ctx). Call Done when the work that reads it is recorded.
func (r *Residency) Use(ctx context.Context, name string) (*WeightUse, error) {
	const op = "holders.Residency.Use"
	for {
		r.mu.Lock()
		w := r.weights[name]
		switch {
		case r.closed:
			r.mu.Unlock()
			return nil, memapi.Errorf(op, memapi.ErrClosed, "residency store is closed")
		case w == nil:
			r.mu.Unlock()
			return nil, memapi.Errorf(op, memapi.ErrInvalidRange, "no weight %q", name)
		case w.moving != nil:
			ch := w.moving
			r.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, &memapi.Error{Op: op, Kind: memapi.ErrInUse, Detail: "weight " + name + " is being moved", Err: ctx.Err()}
			}
		case w.dev != nil:
			w.users++
			r.touchLocked(w)
			r.mu.Unlock()
			return &WeightUse{Addr: w.dev.Addr(), r: r, w: w, buf: w.dev}, nil
		}
		// Offloaded: reload it.
		w.moving = make(chan struct{})
		r.mu.Unlock()
		buf, err := r.reload(ctx, w)
		r.mu.Lock()
		close(w.moving)
		w.moving = nil
		if err != nil {
			r.mu.Unlock()
			return nil, err
		}
		w.dev = buf
		if w.host.Close() == nil {
			w.host = nil
		} // else the host copy is still held: unload or Close releases it
		w.users++
		r.touchLocked(w)
		r.stats.Reloads++
		r.stats.ReloadedTotal += w.size
		r.mu.Unlock()
		return &WeightUse{Addr: buf.Addr(), r: r, w: w, buf: buf}, nil
	}
}

// reload allocates the weight on the device and copies it back from its
// host copy. The caller releases the host copy.
func (r *Residency) reload(ctx context.Context, w *weight) (*pmm.Buffer, error) {
	buf, err := r.dev.Allocate(ctx, w.size)
	if err != nil {
		return nil, err
	}
	if err := pmm.Transfer(ctx, r.cfg.Staging, r.cfg.DeviceContext, buf.Addr(), r.cfg.HostContext, w.host.Addr(), w.size); err != nil {
		return nil, errors.Join(err, buf.Close())
	}
	return buf, nil
}

// offload copies the weight to a new host buffer. The caller closes the
// device copy.
func (r *Residency) offload(ctx context.Context, w *weight) (*pmm.Buffer, error) {
	hb, err := r.host.Allocate(ctx, w.size)
	if err != nil {
		return nil, err
	}
	if err := pmm.Transfer(ctx, r.cfg.Staging, r.cfg.HostContext, hb.Addr(), r.cfg.DeviceContext, w.dev.Addr(), w.size); err != nil {
		return nil, errors.Join(err, hb.Close())
	}
	return hb, nil
}

// Reclaim answers a pressure ticket on the device authority: it offloads
// the coldest weights that are safe to move (resident, not pinned, not in
// use, no fence pending, not used within HotFor) one at a time until the
// ticket is covered, and reports the device bytes released (pending until
// the queue frees them). Tickets on other authorities free 0: the host
// copies are the only copies.
func (r *Residency) Reclaim(ctx context.Context, t governor.Ticket) (memapi.Bytes, error) {
	var freed memapi.Bytes
	var err error
	for t.Authority == r.devAuth && freed < t.Wanted && ctx.Err() == nil {
		w := r.pickVictim()
		if w == nil {
			break
		}
		octx, cancel := context.WithTimeout(ctx, r.cfg.OffloadTimeout)
		if !t.Deadline.IsZero() {
			octx, cancel = withDeadline(octx, cancel, t.Deadline)
		}
		hb, oerr := r.offload(octx, w)
		cancel()
		var closeErr error
		r.mu.Lock()
		if oerr == nil {
			dev := w.dev
			if closeErr = dev.Close(); closeErr == nil {
				w.dev, w.host = nil, hb
				freed += dev.Size()
				r.stats.Offloads++
				r.stats.OffloadedTotal += w.size
			}
		}
		close(w.moving)
		w.moving = nil
		r.mu.Unlock()
		if closeErr != nil {
			oerr = errors.Join(closeErr, hb.Close())
		}
		if oerr != nil {
			err = oerr // the weight stays resident; the next ticket may try again
			break
		}
	}
	r.mu.Lock()
	r.stats.Tickets++
	r.stats.Reclaimed += freed
	r.mu.Unlock()
	return freed, err
}

// pickVictim marks the coldest weight that is safe to offload as moving and
// returns it, or nil.
func (r *Residency) pickVictim() *weight {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	now := r.cfg.Clock()
	var best *weight
	for _, w := range r.weights {
		if w.dev == nil || w.host != nil || w.moving != nil || w.users > 0 || w.pinned ||
			(r.cfg.HotFor > 0 && now.Sub(w.lastUse) < r.cfg.HotFor) || len(w.dev.Pending()) > 0 {
			continue
		}
		if best == nil || w.lastSeq < best.lastSeq {
			best = w
		}
	}
	if best != nil {
		best.moving = make(chan struct{})
	}
	return best
}

// pin sets whether the named weight is pinned (never offloaded). Pinning an
// offloaded weight does not reload it; the next Use does.
func (r *Residency) pin(name string, pinned bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.weights[name]
	if w == nil {
		return memapi.Errorf("holders.Residency.Pin", memapi.ErrInvalidRange, "no weight %q", name)
	}
	w.pinned = pinned
	return nil
}

// unload releases the named weight (behind its recorded fences). It fails
// with memapi.ErrInUse while the weight is used or being moved.
func (r *Residency) unload(name string) error {
	const op = "holders.Residency.Unload"
	r.mu.Lock()
	w := r.weights[name]
	switch {
	case w == nil:
		r.mu.Unlock()
		return memapi.Errorf(op, memapi.ErrInvalidRange, "no weight %q", name)
	case w.users > 0 || w.moving != nil:
		r.mu.Unlock()
		return memapi.Errorf(op, memapi.ErrInUse, "weight %q is in use", name)
	}
	delete(r.weights, name)
	r.mu.Unlock()
	return w.close()
}

func (w *weight) close() error {
	var errs []error
	if w.dev != nil {
		errs = append(errs, w.dev.Close())
	}
	if w.host != nil {
		errs = append(errs, w.host.Close())
	}
	return errors.Join(errs...)
}

// Weights describes every weight, by name.
func (r *Residency) Weights() []WeightInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]WeightInfo, 0, len(r.weights))
	for _, w := range r.weights {
		out = append(out, WeightInfo{Name: w.name, Size: w.size, Pinned: w.pinned, Resident: w.dev != nil, Users: w.users,
			InFlight: w.dev != nil && len(w.dev.Pending()) > 0, LastUse: w.lastUse})
	}
	slices.SortFunc(out, func(a, b WeightInfo) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Stats returns the store's figures.
func (r *Residency) Stats() ResidencyStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stats
	for _, w := range r.weights {
		switch {
		case w.dev != nil:
			st.Resident++
			st.ResidentBytes += w.size
		case w.host != nil:
			st.Offloaded++
			st.OffloadedBytes += w.size
		}
	}
	st.Weights = len(r.weights)
	return st
}

// Close releases every weight (behind recorded fences) and ends both
// bindings. It fails with memapi.ErrInUse, changing nothing, while a weight
// is used or being moved. It is idempotent.
func (r *Residency) Close() error {
	const op = "holders.Residency.Close"
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	for _, w := range r.weights {
		if w.users > 0 || w.moving != nil {
			r.mu.Unlock()
			return memapi.Errorf(op, memapi.ErrInUse, "weight %q is in use", w.name)
		}
	}
	r.closed = true
	ws := r.weights
	r.weights = map[string]*weight{}
	r.mu.Unlock()
	var errs []error
	for _, w := range ws {
		errs = append(errs, w.close())
	}
	errs = append(errs, r.dev.Close(), r.host.Close())
	return errors.Join(errs...)
}

// withDeadline narrows ctx to d, chaining the cancel functions.
func withDeadline(ctx context.Context, cancel context.CancelFunc, d time.Time) (context.Context, context.CancelFunc) {
	dctx, dcancel := context.WithDeadline(ctx, d)
	return dctx, func() { dcancel(); cancel() }
}
