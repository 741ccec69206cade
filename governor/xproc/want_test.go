package xproc

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"

	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
)

// childWant: join, and wait (a minute at most) for a reservation of
// MEMGEN_XPROC_WANT bytes the ledger cannot give; "wanting" once its want is
// posted. The parent kills it.
func childWant() error {
	c, err := joinCPU()
	if err != nil {
		return err
	}
	n, _ := strconv.Atoi(os.Getenv(wantEnv))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() { _, _ = c.a.Reserve(ctx, governor.Request{Holder: "h", Role: "r", Bytes: memapi.Bytes(n)}) }()
	for {
		if h, _, err := Inspect(c.l.path); err == nil && h.Want != 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Println("wanting")
	waitEOF()
	return nil
}

const wantEnv = "MEMGEN_XPROC_WANT"

// wantGone waits up to d for the ledger at path to show no want.
func wantGone(t *testing.T, path string, d time.Duration) bool {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if h, _ := inspect(t, path); h.Want == 0 {
			return true
		}
	}
	return false
}

// A want belongs to its slot: a process killed while its reservation waits
// leaves no want behind once its slot is reclaimed, and a reservation that
// gives up withdraws its want.
func TestWantOfADeadProcess(t *testing.T) {
	path := ledgerPath(t)
	events := make(chan event, 8)
	_, a, _ := member(t, path, 1<<20, Options{Create: &CreateOptions{Capacity: 1 << 20, Slots: 4},
		onEvent: func(e event) {
			if e.Kind == eventReclaimed {
				events <- e
			}
		}})
	ls := take(t, a, 768<<10)
	defer ls.Refund(768 << 10)
	p := spawn(t, "want", pathEnv+"="+path, wantEnv+"="+strconv.Itoa(512<<10))
	p.expect(t, "wanting")
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
	select {
	case <-events:
	case <-time.After(watchdog.Bound):
		t.Fatalf("watchdog: the killed process's slot was not reclaimed within %v", watchdog.Bound)
	}
	if !wantGone(t, path, watchdog.Bound) {
		h, _ := inspect(t, path)
		t.Fatalf("the dead process's want of %d bytes is still posted a second after its slot was reclaimed", h.Want)
	}

	// A reservation in this process that gives up withdraws its want.
	_, b, _ := member(t, path, 1<<20, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := b.Reserve(ctx, governor.Request{Holder: "h", Role: "r", Bytes: 512 << 10}); err == nil {
		t.Fatal("a reservation beyond the unclaimed bytes succeeded")
	}
	if !wantGone(t, path, watchdog.Bound) {
		t.Fatal("the want of a reservation that gave up is still posted")
	}
}

// The processes that answer a want free together no more than the
// shortfall plus one granule (an allocation of their holder, 64 KiB) each.
// MEMGEN_XPROC_ANSWERS lists the process counts (make xproc-soak: 2,6,12).
func TestBoundedAnswers(t *testing.T) {
	counts := []int{2, 6}
	if v := os.Getenv("MEMGEN_XPROC_ANSWERS"); v != "" {
		counts = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				t.Fatalf("MEMGEN_XPROC_ANSWERS=%q", v)
			}
			counts = append(counts, n)
		}
	}
	for _, n := range counts {
		t.Run(strconv.Itoa(n), func(t *testing.T) { boundedAnswers(t, n) })
	}
}

// boundedAnswers runs n cache processes holding 960 KiB each, all of the
// capacity, and a reservation here of three quarters of what up to four of
// them hold (so that several must answer); it returns the bytes freed.
func boundedAnswers(t testing.TB, n int) (freed uint64) {
	const held, granule = 960 << 10, 64 << 10
	want := min(n, 4) * held * 3 / 4
	path := ledgerPath(t)
	_, a, _ := member(t, path, 0, Options{Create: &CreateOptions{Capacity: uint64(n) * held, Slots: n + 2}})
	var ps []*proc
	for range n {
		p := spawn(t, "cache", pathEnv+"="+path)
		p.expect(t, "ready")
		ps = append(ps, p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gr, err := a.Reserve(ctx, governor.Request{Holder: "h", Role: "r", Bytes: memapi.Bytes(want), Priority: 9})
	if err != nil {
		t.Fatalf("under pressure: %v", err)
	}
	// Every process has had time to answer the want.
	time.Sleep(200 * time.Millisecond)
	answering := 0
	for _, p := range ps {
		p.in.Close()
		f := p.expect(t, "tickets")
		if b := atoi(t, f[1]); b != 0 {
			answering++
			freed += b
		}
		p.expect(t, "done")
		if err := p.cmd.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	_ = gr.Cancel()
	t.Logf("%d processes: %d answered, freeing %d bytes for a shortfall of %d (bound %d)", n, answering, freed, want, want+answering*granule)
	if freed > uint64(want+answering*granule) || freed < uint64(want) {
		t.Fatalf("%d processes freed %d bytes for a shortfall of %d: want at most %d", n, freed, want, want+answering*granule)
	}
	return freed
}

// A process takes shares of several wants at once no larger, together,
// than what it can give: the rest is left for the other processes.
func TestSharesBoundedByWhatAProcessCanGive(t *testing.T) {
	path := ledgerPath(t)
	_, b, _ := member(t, path, 0, Options{Create: &CreateOptions{Capacity: 2000, Slots: 8}, Poll: time.Hour})
	_, c, _ := member(t, path, 0, Options{Poll: time.Hour})
	_, a, ga := member(t, path, 0, Options{Poll: time.Hour})
	ls, _ := slowCache(t, a, ga, 600, 0)
	defer func() { _ = ls.Refund(ls.Bytes()) }()
	lb, lc := take(t, b, 700), take(t, c, 700)
	defer lb.Refund(700)
	defer lc.Refund(700)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan struct{}, 2)
	for _, x := range []*authority{b, c} {
		go func() {
			if gr, err := x.Reserve(ctx, governor.Request{Holder: "h", Role: "r", Bytes: 500}); err == nil {
				_ = gr.Cancel()
			}
			done <- struct{}{}
		}()
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if h, _ := inspect(t, path); h.Want == 1000 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the two wants were not posted")
		}
	}
	a.sem <- struct{}{}
	shares, err := a.takeShares(context.Background())
	a.unacquire()
	if err != nil {
		t.Fatal(err)
	}
	var sum memapi.Bytes
	for _, s := range shares {
		sum += s.bytes
	}
	if sum != 600 || len(shares) != 2 {
		t.Fatalf("shares %+v: %d bytes in all, want the 600 this process can give, split over the two wants", shares, sum)
	}
	cancel()
	<-done
	<-done
}

// While a round's shares are out (being answered), the asking process
// still short does not start a new round: another process takes nothing
// more, so the answers never ask twice for the same bytes.
func TestNoNewRoundWhileSharesAreOut(t *testing.T) {
	path := ledgerPath(t)
	_, b, _ := member(t, path, 0, Options{Create: &CreateOptions{Capacity: 2000, Slots: 8}, Poll: time.Hour})
	_, a, ga := member(t, path, 0, Options{Poll: time.Hour})
	_, c, gc := member(t, path, 0, Options{Poll: time.Hour})
	la, _ := slowCache(t, a, ga, 700, 0)
	defer func() { _ = la.Refund(la.Bytes()) }()
	lc, _ := slowCache(t, c, gc, 700, 0)
	defer func() { _ = lc.Refund(lc.Bytes()) }()
	lb := take(t, b, 600)
	defer lb.Refund(600)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		if gr, err := b.Reserve(ctx, governor.Request{Holder: "h", Role: "r", Bytes: 500}); err == nil {
			_ = gr.Cancel()
		}
		close(done)
	}()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if h, _ := inspect(t, path); h.Want == 500 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the want was not posted")
		}
	}
	shares := func(x *authority) []share {
		x.sem <- struct{}{}
		defer x.unacquire()
		s, err := x.takeShares(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := shares(a); len(s) != 1 || s[0].bytes != 500 {
		t.Fatalf("the first answering process's shares: %+v, want all 500", s)
	}
	// B, still short, settles: its round is out, so it stays.
	b.sem <- struct{}{}
	if err := b.claimWaitersLocked(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.unacquire()
	if s := shares(c); len(s) != 0 {
		t.Fatalf("another process took %+v of a round already out", s)
	}
	cancel()
	<-done
}

// A want whose process died before anyone answered it is not answered:
// the next settle finds the process gone, reclaims its slot and want in
// the same pass, and asks no holder here to free anything for it.
func TestDeadWantIsNotAnswered(t *testing.T) {
	path := ledgerPath(t)
	// An hour's Poll: no watcher round and no settle but the test's.
	_, a, g := member(t, path, 1<<20, Options{Create: &CreateOptions{Capacity: 1 << 20, Slots: 4}, Poll: time.Hour})
	var asked atomic.Int64
	var mu sync.Mutex
	var leases []governor.Lease
	cache := governor.HolderFunc(func(ctx context.Context, tk governor.Ticket) (memapi.Bytes, error) {
		asked.Add(1)
		mu.Lock()
		defer mu.Unlock()
		var n memapi.Bytes
		for n < tk.Wanted && len(leases) > 0 {
			if err := leases[0].Refund(64 << 10); err != nil {
				return n, err
			}
			leases, n = leases[1:], n+64<<10
		}
		return n, nil
	})
	if err := g.Register("cache", cache, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	for range 12 {
		gr, err := a.Reserve(context.Background(), governor.Request{Holder: "cache", Role: "blocks", Bytes: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		if err := gr.Draw(64 << 10); err != nil {
			t.Fatal(err)
		}
		ls, err := gr.Commit()
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, ls)
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, ls := range leases {
			_ = ls.Refund(64 << 10)
		}
	}()
	p := spawn(t, "want", pathEnv+"="+path, wantEnv+"="+strconv.Itoa(512<<10))
	p.expect(t, "wanting")
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
	if err := a.Settle(); err != nil {
		t.Fatal(err)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("holders here were asked %d times to free memory for a process that had died", n)
	}
	h, slots := inspect(t, path)
	if h.Want != 0 {
		t.Errorf("the dead process's want of %d bytes is still posted after a settle", h.Want)
	}
	for _, s := range slots {
		if s.PID == p.pid {
			t.Errorf("the dead process's slot %d is still held after a settle: %+v", s.Index, s)
		}
	}
}
