package governor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
	"pgregory.net/rapid"
)

// TestLedgerStateMachine runs random sequences of reserve (with pressure on
// holders that free random amounts, 0 included), draw, undraw, commit,
// cancel, refund, pending, release, capacity changes and clock moves past
// deadlines, and after most steps compares the governor with a simple
// reference model and checks the ledger identity (some steps are left
// unchecked, so that sequences run on without a read between them). The
// model forgets a grant whose use ended (cancelled, or its lease refunded
// whole) and its lease at the next reservation; tests of ended handles
// are in record_test.go.
func TestLedgerStateMachine(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := newModel(rt)
		defer m.g.Close()
		rt.Repeat(map[string]func(*rapid.T){
			"":         m.check,
			"reserve":  func(rt *rapid.T) { m.reserve(rt) },
			"lease":    m.lease,
			"draw":     m.draw,
			"undraw":   m.undraw,
			"commit":   m.commit,
			"cancel":   m.cancel,
			"refund":   m.refund,
			"pending":  m.markPending,
			"release":  m.release,
			"advance":  m.advance,
			"capacity": m.setCapacity,
			"cycle":    m.cycle,
		})
	})
}

type mGrantState int

const (
	gOpen mGrantState = iota
	gCommitted
	gCancelled
	gExpired
)

type mGrant struct {
	gr       Grant
	auth     memapi.AuthorityID
	holder   HolderID
	size     memapi.Bytes
	drawn    memapi.Bytes
	state    mGrantState
	deadline time.Time
}

type mLease struct {
	l                Lease
	auth             memapi.AuthorityID
	holder           HolderID
	charged, pending memapi.Bytes
}

type mHolder struct {
	id        HolderID
	priority  int
	reclaims  bool
	guarantee map[memapi.AuthorityID]memapi.Bytes
	limit     map[memapi.AuthorityID]memapi.Bytes
	// behaviour for the next reservation, drawn before it
	pct     memapi.Bytes
	pending bool
}

type model struct {
	rt      *rapid.T
	clock   *fakeClock
	g       *Governor
	waiting chan Event

	caps    map[memapi.AuthorityID]memapi.Bytes
	auths   []memapi.AuthorityID
	holders map[HolderID]*mHolder
	hids    []HolderID
	grants  []*mGrant
	leases  []*mLease

	granted map[memapi.AuthorityID]uint64 // grants made
	spent   []*mGrant                     // grants whose use ended, forgotten by the next reservation (forgetSpent)

	// written by Reclaim callbacks in the reserving goroutine while the
	// test goroutine waits for it
	mu      sync.Mutex
	tickets []ticketSeen
	wanted  memapi.Bytes // bytes of the reservation being made
	cbErr   error
}

type ticketSeen struct {
	holder HolderID
	t      Ticket
}

func newModel(rt *rapid.T) *model {
	m := &model{
		rt:      rt,
		clock:   newFakeClock(),
		waiting: make(chan Event, 8),
		caps:    map[memapi.AuthorityID]memapi.Bytes{},
		holders: map[HolderID]*mHolder{},
		granted: map[memapi.AuthorityID]uint64{},
	}
	m.g = New(Options{Clock: m.clock, OnEvent: func(e Event) {
		if e.Kind == EventWaiting {
			m.waiting <- e
		}
	}})
	for i := range 2 {
		id := memapi.AuthorityID(fmt.Sprintf("a%d", i))
		c := memapi.Bytes(rapid.IntRange(100, 1000).Draw(rt, "capacity"))
		if err := m.g.AddAuthority(id, c); err != nil {
			rt.Fatal(err)
		}
		m.caps[id] = c
		m.auths = append(m.auths, id)
	}
	for i := range 3 {
		h := &mHolder{
			id:        HolderID(fmt.Sprintf("h%d", i)),
			priority:  int(rapid.IntRange(-2, 2).Draw(rt, "priority")),
			reclaims:  i != 2 || rapid.Bool().Draw(rt, "reclaims"),
			guarantee: map[memapi.AuthorityID]memapi.Bytes{},
			limit:     map[memapi.AuthorityID]memapi.Bytes{},
		}
		for _, a := range m.auths {
			if rapid.Bool().Draw(rt, "has guarantee") {
				h.guarantee[a] = memapi.Bytes(rapid.IntRange(0, int(m.caps[a]/2)).Draw(rt, "guarantee"))
			}
			if rapid.Bool().Draw(rt, "has limit") {
				h.limit[a] = memapi.Bytes(rapid.IntRange(int(h.guarantee[a]), int(m.caps[a])).Draw(rt, "limit"))
			}
		}
		var rec Holder
		if h.reclaims {
			rec = HolderFunc(func(ctx context.Context, t Ticket) (memapi.Bytes, error) { return m.reclaim(h, t) })
		}
		if err := m.g.Register(h.id, rec, HolderOptions{Priority: h.priority, Guarantee: h.guarantee, Limit: h.limit}); err != nil {
			rt.Fatal(err)
		}
		m.holders[h.id] = h
		m.hids = append(m.hids, h.id)
	}
	return m
}

// figures of the model for an authority, optionally for one holder.
func (m *model) figures(a memapi.AuthorityID, h HolderID) (reserved, charged, pending memapi.Bytes) {
	for _, g := range m.grants {
		if g.auth != a || (h != "" && g.holder != h) {
			continue
		}
		switch g.state {
		case gOpen:
			reserved += g.size
		case gExpired:
			reserved += g.drawn
		}
	}
	for _, l := range m.leases {
		if l.auth == a && (h == "" || l.holder == h) {
			charged += l.charged
			pending += l.pending
		}
	}
	return
}

func (m *model) free(a memapi.AuthorityID) memapi.Bytes {
	r, c, p := m.figures(a, "")
	return m.caps[a] - r - c - p
}

func (m *model) overGuarantee(a memapi.AuthorityID, h *mHolder) memapi.Bytes {
	_, c, _ := m.figures(a, h.id)
	if !h.reclaims || c <= h.guarantee[a] {
		return 0
	}
	return c - h.guarantee[a]
}

func (m *model) fail(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cbErr == nil {
		m.cbErr = fmt.Errorf(format, args...)
	}
}

// reclaim is every holder's Reclaim: it checks the ticket against the model
// and frees pct percent of what was asked from its leases, refunding or
// marking pending.
func (m *model) reclaim(h *mHolder, t Ticket) (memapi.Bytes, error) {
	m.mu.Lock()
	m.tickets = append(m.tickets, ticketSeen{h.id, t})
	m.mu.Unlock()
	// The ticket asks for what the reservation still lacks beyond free and
	// pending bytes, and never for guaranteed bytes.
	_, _, pending := m.figures(t.Authority, "")
	short := m.wanted - min(m.wanted, m.free(t.Authority)+pending)
	if over := m.overGuarantee(t.Authority, h); t.Wanted != min(short, over) || t.Wanted == 0 {
		m.fail("ticket %+v to %s: want min(shortfall %d, over its guarantee %d)", t, h.id, short, over)
	}
	target := t.Wanted * h.pct / 100
	var freed memapi.Bytes
	for _, l := range m.leases {
		if freed >= target || l.auth != t.Authority || l.holder != h.id || l.charged == 0 {
			continue
		}
		n := min(target-freed, l.charged)
		if h.pending {
			if err := l.l.MarkPending(n); err != nil {
				m.fail("MarkPending in Reclaim: %v", err)
				return freed, err
			}
			l.charged -= n
			l.pending += n
		} else {
			if err := l.l.Refund(n); err != nil {
				m.fail("Refund in Reclaim: %v", err)
				return freed, err
			}
			fromPending := min(n, l.pending) // a refund takes pending bytes first
			l.pending -= fromPending
			l.charged -= n - fromPending
			if n != 0 && l.charged+l.pending == 0 {
				m.spend(m.grantOf(l))
			}
		}
		freed += n
	}
	return freed, nil
}

func (m *model) check(rt *rapid.T) {
	if rapid.IntRange(0, 3).Draw(rt, "skip check") == 0 {
		return
	}
	s := m.g.Snapshot()
	if len(s.Authorities) != len(m.auths) {
		rt.Fatalf("%d authorities", len(s.Authorities))
	}
	for _, as := range s.Authorities {
		r, c, p := m.figures(as.ID, "")
		var expiredDrawn memapi.Bytes
		var open, leases int
		for _, g := range m.grants {
			if g.auth == as.ID && g.state == gExpired {
				expiredDrawn += g.drawn
			}
			if g.auth == as.ID && g.state == gOpen {
				open++
			}
		}
		for _, l := range m.leases {
			if l.auth == as.ID && l.charged+l.pending != 0 {
				leases++
			}
		}
		type figs struct {
			Capacity, Reserved, Charged, Pending, Free, ExpiredDrawn memapi.Bytes
			Grants, Leases                                           int
			Granted                                                  uint64
		}
		want := figs{Capacity: m.caps[as.ID], Reserved: r, Charged: c, Pending: p, Free: m.caps[as.ID] - r - c - p,
			ExpiredDrawn: expiredDrawn, Grants: open, Leases: leases, Granted: m.granted[as.ID]}
		got := figs{Capacity: as.Capacity, Reserved: as.Reserved, Charged: as.Charged, Pending: as.Pending, Free: as.Free,
			ExpiredDrawn: as.ExpiredDrawn, Grants: as.Grants, Leases: as.Leases, Granted: as.Granted}
		if got != want {
			rt.Fatalf("authority %s:\n got %+v\nwant %+v", as.ID, got, want)
		}
		if !as.Balanced() || as.Waiters != 0 || as.WaitingBytes != 0 || as.Asking != 0 {
			rt.Fatalf("authority %s: balanced %v waiters %d/%d asking %d", as.ID, as.Balanced(), as.Waiters, as.WaitingBytes, as.Asking)
		}
	}
	for _, hs := range s.Holders {
		for _, ha := range hs.Authorities {
			r, c, p := m.figures(ha.Authority, hs.ID)
			if ha.Reserved != r || ha.Charged != c || ha.Pending != p || ha.Waiting != 0 {
				rt.Fatalf("holder %s on %s: got r%d c%d p%d w%d, want r%d c%d p%d", hs.ID, ha.Authority, ha.Reserved, ha.Charged, ha.Pending, ha.Waiting, r, c, p)
			}
		}
	}
	now := m.clock.Now()
	for _, g := range m.grants {
		if g.gr.drawnNow() != g.drawn || isOpen(g.gr) != (g.state == gOpen && (g.deadline.IsZero() || now.Before(g.deadline))) {
			rt.Fatalf("grant %+v: drawn %d open %v", *g, g.gr.drawnNow(), isOpen(g.gr))
		}
	}
	for _, l := range m.leases {
		if l.l.charged() != l.charged || l.l.pending() != l.pending {
			rt.Fatalf("lease %+v: charged %d pending %d", *l, l.l.charged(), l.l.pending())
		}
	}
}

// lease is the ordinary allocation flow: reserve, draw it all, commit.
func (m *model) lease(rt *rapid.T) {
	g := m.reserve(rt)
	if g == nil {
		return
	}
	if err := g.gr.Draw(g.size); err != nil {
		rt.Fatal(err)
	}
	g.drawn = g.size
	m.commitGrant(rt, g)
}

// reserve reserves and returns the model's grant, or nil when it failed as
// the model says it must.
func (m *model) reserve(rt *rapid.T) *mGrant {
	m.forgetSpent()
	a := rapid.SampledFrom(m.auths).Draw(rt, "authority")
	h := m.holders[rapid.SampledFrom(m.hids).Draw(rt, "holder")]
	bytes := memapi.Bytes(rapid.IntRange(1, max(10, int(m.caps[a]*6/5))).Draw(rt, "bytes"))
	var deadline time.Time
	if rapid.Bool().Draw(rt, "deadline") {
		deadline = m.clock.Now().Add(time.Duration(rapid.IntRange(1, 30).Draw(rt, "seconds")) * time.Second)
	}
	for _, id := range m.hids {
		x := m.holders[id]
		x.pct = memapi.Bytes(rapid.SampledFrom([]int{0, 30, 100, 200}).Draw(rt, "reclaim percent"))
		x.pending = rapid.Bool().Draw(rt, "reclaim as pending")
	}
	r, c, p := m.figures(a, h.id)
	free := m.free(a)
	_, _, pendingAll := m.figures(a, "")

	m.tickets = nil
	m.wanted = bytes
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := make(chan result, 1)
	go func() {
		gr, err := m.g.Reserve(ctx, Request{Authority: a, Holder: h.id, Role: "model", Bytes: bytes, Deadline: deadline})
		ch <- result{gr, err}
	}()
	var res result
	var waited bool
	select {
	case res = <-ch:
	case <-m.waiting:
		waited = true
	}
	if m.cbErr != nil {
		rt.Fatal(m.cbErr)
	}
	switch lim := h.limit[a]; {
	case lim != 0 && r+c+p+bytes > lim:
		if waited || !errors.Is(res.err, errOverLimit) {
			rt.Fatalf("over limit: waited %v err %v", waited, res.err)
		}
		return nil
	case free >= bytes:
		if waited || res.err != nil || len(m.tickets) != 0 {
			rt.Fatalf("fits: waited %v err %v tickets %d", waited, res.err, len(m.tickets))
		}
		return m.addGrant(res.gr, a, h.id, bytes, deadline)
	case bytes > m.caps[a]:
		if waited || !errors.Is(res.err, memapi.ErrOverBudget) || len(m.tickets) != 0 {
			rt.Fatalf("over capacity: waited %v err %v", waited, res.err)
		}
		return nil
	}
	// Pressure: check the tickets.
	short := bytes - free
	if short > pendingAll {
		short -= pendingAll
	} else {
		short = 0
	}
	if short == 0 && len(m.tickets) != 0 {
		rt.Fatalf("tickets %+v though pending bytes cover the shortfall", m.tickets)
	}
	for i := 1; i < len(m.tickets); i++ {
		if m.holders[m.tickets[i].holder].priority < m.holders[m.tickets[i-1].holder].priority {
			rt.Fatalf("asked %s before lower-priority %s", m.tickets[i-1].holder, m.tickets[i].holder)
		}
	}
	for _, ts := range m.tickets {
		if ts.t.Authority != a || !ts.t.Deadline.Equal(deadline) {
			rt.Fatalf("ticket %+v", ts.t)
		}
	}
	if !waited {
		// Granted at once: the reclaims made room, so with the grant the
		// model's figures still fit the capacity (summed, since free() of
		// an overcommitted model would wrap around).
		if r, c, p := m.figures(a, ""); res.err != nil || r+c+p+bytes > m.caps[a] {
			rt.Fatalf("not waited but err %v, or %d reserved + %d charged + %d pending + %d granted > capacity %d", res.err, r, c, p, bytes, m.caps[a])
		}
		return m.addGrant(res.gr, a, h.id, bytes, deadline)
	}
	// Waiting: nothing the model can see is enough, and every holder with
	// bytes over its guarantee was asked if pending bytes did not cover it.
	if m.free(a) >= bytes {
		rt.Fatalf("waiting with %d free for %d", m.free(a), bytes)
	}
	_, _, pendingNow := m.figures(a, "")
	if m.free(a)+pendingNow < bytes {
		for _, id := range m.hids {
			x := m.holders[id]
			if m.overGuarantee(a, x) != 0 && !slices.ContainsFunc(m.tickets, func(ts ticketSeen) bool { return ts.holder == id }) {
				rt.Fatalf("waiting but %s (with %d over its guarantee) was not asked", id, m.overGuarantee(a, x))
			}
		}
	}
	// Either refund a lease (maybe enough to serve it) or cancel the wait.
	var cands []*mLease
	for _, l := range m.leases {
		if l.auth == a && l.charged+l.pending != 0 {
			cands = append(cands, l)
		}
	}
	if len(cands) != 0 && rapid.Bool().Draw(rt, "refund while waiting") {
		l := rapid.SampledFrom(cands).Draw(rt, "lease")
		n := l.charged + l.pending
		if err := l.l.Refund(n); err != nil {
			rt.Fatal(err)
		}
		if n != 0 {
			m.spend(m.grantOf(l))
		}
		l.charged, l.pending = 0, 0
		if m.free(a) >= bytes {
			res = watchdog.Recv(rt, bound, "the served reservation", ch)
			if res.err != nil {
				rt.Fatalf("refund left %d free for %d but: %v", m.free(a), bytes, res.err)
			}
			return m.addGrant(res.gr, a, h.id, bytes, deadline)
		}
	}
	cancel()
	res = watchdog.Recv(rt, bound, "the cancelled reservation", ch)
	if !errors.Is(res.err, context.Canceled) || !errors.Is(res.err, memapi.ErrOverBudget) {
		rt.Fatalf("cancelled wait: %v", res.err)
	}
	return nil
}

func (m *model) leaseOf(g *mGrant) *mLease {
	for _, l := range m.leases {
		if Grant(l.l) == g.gr {
			return l
		}
	}
	return nil
}

// forget drops a grant and its lease from the model.
func (m *model) forget(g *mGrant) {
	if l := m.leaseOf(g); l != nil {
		m.leases = slices.DeleteFunc(m.leases, func(x *mLease) bool { return x == l })
	}
	m.grants = slices.DeleteFunc(m.grants, func(x *mGrant) bool { return x == g })
}

// spend marks g's use as ended (cancelled, or its lease emptied by a refund
// or a release): the governor may issue it again from the next
// reservation on, so the model forgets it then (forgetSpent); until then
// every check on it still runs.
func (m *model) spend(g *mGrant) {
	if g != nil && !slices.Contains(m.spent, g) {
		m.spent = append(m.spent, g)
	}
}

// forgetSpent forgets the spent grants before a reservation.
func (m *model) forgetSpent() {
	for _, g := range m.spent {
		m.forget(g)
	}
	m.spent = nil
}

// grantOf returns the model's grant whose lease is l.
func (m *model) grantOf(l *mLease) *mGrant {
	for _, g := range m.grants {
		if g.gr == Grant(l.l) {
			return g
		}
	}
	return nil
}

func (m *model) addGrant(gr Grant, a memapi.AuthorityID, h HolderID, n memapi.Bytes, deadline time.Time) *mGrant {
	// The reservation may have been served in the record of a grant spent
	// while it ran (a reclaim's release, a refund while it waited): those
	// grants are gone from the model from now on.
	m.forgetSpent()
	if gr == (Grant{}) || gr.Size() != n || gr.Authority() != a || gr.holder() != h || !gr.deadline().Equal(deadline) || gr.remaining() != n {
		m.rt.Fatalf("grant %+v", gr)
	}
	g := &mGrant{gr: gr, auth: a, holder: h, size: n, deadline: deadline}
	m.grants = append(m.grants, g)
	m.granted[a]++
	return g
}

// cycle is the common path, one to four times: reserve what fits, draw it
// all, commit, refund the whole lease. The figures end where they began.
func (m *model) cycle(rt *rapid.T) {
	a := rapid.SampledFrom(m.auths).Draw(rt, "authority")
	h := m.holders[rapid.SampledFrom(m.hids).Draw(rt, "holder")]
	room := m.free(a)
	if lim := h.limit[a]; lim != 0 {
		r, c, p := m.figures(a, h.id)
		room = min(room, lim-min(lim, r+c+p))
	}
	if room == 0 {
		rt.Skip("no room")
	}
	m.forgetSpent()
	n := memapi.Bytes(rapid.IntRange(1, int(room)).Draw(rt, "n"))
	for range rapid.IntRange(1, 4).Draw(rt, "cycles") {
		if rapid.Bool().Draw(rt, "new size") {
			n = memapi.Bytes(rapid.IntRange(1, int(room)).Draw(rt, "n"))
		}
		into, err := m.g.Reserve(context.Background(), Request{Authority: a, Holder: h.id, Role: "model", Bytes: n})
		if err != nil {
			rt.Fatal(err)
		}
		if err := into.Draw(n); err != nil {
			rt.Fatal(err)
		}
		l, err := into.Commit()
		if err != nil {
			rt.Fatal(err)
		}
		if err := l.Refund(n); err != nil {
			rt.Fatal(err)
		}
		m.granted[a]++
	}
}

func (m *model) pickGrant(rt *rapid.T) *mGrant {
	if len(m.grants) == 0 {
		rt.Skip("no grants")
	}
	return rapid.SampledFrom(m.grants).Draw(rt, "grant")
}

func (m *model) pickLease(rt *rapid.T) *mLease {
	if len(m.leases) == 0 {
		rt.Skip("no leases")
	}
	return rapid.SampledFrom(m.leases).Draw(rt, "lease")
}

func (m *model) draw(rt *rapid.T) {
	g := m.pickGrant(rt)
	n := memapi.Bytes(rapid.IntRange(0, int(g.size)+5).Draw(rt, "n"))
	err := g.gr.Draw(n)
	switch {
	case g.state != gOpen:
		mustKindRapid(rt, err, memapi.ErrGrantClosed)
	case n > g.size-g.drawn:
		mustKindRapid(rt, err, memapi.ErrGrantExhausted)
	case err != nil:
		rt.Fatal(err)
	default:
		g.drawn += n
	}
}

func (m *model) undraw(rt *rapid.T) {
	g := m.pickGrant(rt)
	n := memapi.Bytes(rapid.IntRange(0, int(g.drawn)+2).Draw(rt, "n"))
	var err error
	if rapid.Bool().Draw(rt, "as refund") {
		err = g.gr.Refund(n)
	} else {
		err = g.gr.Undraw(n)
	}
	switch {
	case g.state == gCommitted || g.state == gCancelled:
		mustKindRapid(rt, err, memapi.ErrGrantClosed)
	case n > g.drawn:
		mustKindRapid(rt, err, errOverReturn)
	case err != nil:
		rt.Fatal(err)
	default:
		g.drawn -= n
	}
}

func (m *model) commit(rt *rapid.T) {
	g := m.pickGrant(rt)
	l, err := g.gr.Commit()
	if g.state != gOpen {
		mustKindRapid(rt, err, memapi.ErrGrantClosed)
		return
	}
	if err != nil {
		rt.Fatal(err)
	}
	m.addLease(rt, g, l)
}

func (m *model) commitGrant(rt *rapid.T, g *mGrant) {
	l, err := g.gr.Commit()
	if err != nil {
		rt.Fatal(err)
	}
	m.addLease(rt, g, l)
}

func (m *model) addLease(rt *rapid.T, g *mGrant, l Lease) {
	g.state = gCommitted
	m.leases = append(m.leases, &mLease{l: l, auth: g.auth, holder: g.holder, charged: g.drawn})
	g.drawn = 0 // the drawn bytes are the lease's now
	if l.holder() != g.holder || l.Authority() != g.auth {
		rt.Fatalf("lease of %s on %s", l.holder(), l.Authority())
	}
}

func (m *model) cancel(rt *rapid.T) {
	g := m.pickGrant(rt)
	err := g.gr.Cancel()
	switch {
	case g.state == gCommitted:
		mustKindRapid(rt, err, memapi.ErrGrantClosed)
	case g.drawn != 0:
		mustKindRapid(rt, err, memapi.ErrInUse)
	case err != nil:
		rt.Fatal(err)
	case g.state == gOpen:
		g.state = gCancelled
		m.spend(g)
	}
}

func (m *model) refund(rt *rapid.T) {
	l := m.pickLease(rt)
	n := memapi.Bytes(rapid.IntRange(0, int(l.charged+l.pending)+2).Draw(rt, "n"))
	err := l.l.Refund(n)
	if n > l.charged+l.pending {
		mustKindRapid(rt, err, errOverReturn)
		return
	}
	if err != nil {
		rt.Fatal(err)
	}
	fromPending := min(n, l.pending)
	l.pending -= fromPending
	l.charged -= n - fromPending
	if n != 0 && l.charged+l.pending == 0 {
		m.spend(m.grantOf(l))
	}
}

func (m *model) markPending(rt *rapid.T) {
	l := m.pickLease(rt)
	n := memapi.Bytes(rapid.IntRange(0, int(l.charged)+2).Draw(rt, "n"))
	err := l.l.MarkPending(n)
	if n > l.charged {
		mustKindRapid(rt, err, errOverReturn)
		return
	}
	if err != nil {
		rt.Fatal(err)
	}
	l.charged -= n
	l.pending += n
}

func (m *model) release(rt *rapid.T) {
	l := m.pickLease(rt)
	if n := l.l.release(); n != l.charged+l.pending {
		rt.Fatalf("release returned %d, want %d", n, l.charged+l.pending)
	}
	if l.charged+l.pending != 0 {
		m.spend(m.grantOf(l))
	}
	l.charged, l.pending = 0, 0
}

func (m *model) advance(rt *rapid.T) {
	d := time.Duration(rapid.IntRange(0, 20).Draw(rt, "seconds")) * time.Second
	m.clock.Advance(d)
	now := m.clock.Now()
	for _, g := range m.grants {
		if g.state == gOpen && !g.deadline.IsZero() && !now.Before(g.deadline) {
			g.state = gExpired
		}
	}
}

func (m *model) setCapacity(rt *rapid.T) {
	a := rapid.SampledFrom(m.auths).Draw(rt, "authority")
	c := memapi.Bytes(rapid.IntRange(0, 1200).Draw(rt, "capacity"))
	err := m.g.SetCapacity(a, c)
	r, ch, p := m.figures(a, "")
	if c < r+ch+p {
		mustKindRapid(rt, err, memapi.ErrInUse)
		return
	}
	if err != nil {
		rt.Fatal(err)
	}
	m.caps[a] = c
}

func mustKindRapid(rt *rapid.T, err, kind error) {
	rt.Helper()
	if !errors.Is(err, kind) {
		rt.Fatalf("error %v, want %v", err, kind)
	}
}
