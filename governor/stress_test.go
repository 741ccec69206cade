package governor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
	"go.uber.org/goleak"
)

// stressHolder keeps the leases its workers committed; Reclaim gives some
// back (refunding, or marking pending for a worker to refund later, as a
// fence would) or, at random, nothing.
type stressHolder struct {
	mu      sync.Mutex
	rng     *rand.Rand
	leases  []Lease
	pending []Lease
}

func (s *stressHolder) put(l Lease) {
	s.mu.Lock()
	s.leases = append(s.leases, l)
	s.mu.Unlock()
}

func (s *stressHolder) take() Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.leases) == 0 {
		return Lease{}
	}
	i := s.rng.IntN(len(s.leases))
	l := s.leases[i]
	s.leases[i] = s.leases[len(s.leases)-1]
	s.leases = s.leases[:len(s.leases)-1]
	return l
}

func (s *stressHolder) takePending() Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 {
		return Lease{}
	}
	l := s.pending[len(s.pending)-1]
	s.pending = s.pending[:len(s.pending)-1]
	return l
}

func (s *stressHolder) Reclaim(ctx context.Context, t Ticket) (memapi.Bytes, error) {
	s.mu.Lock()
	mode := s.rng.IntN(4)
	s.mu.Unlock()
	if mode == 0 {
		return 0, nil // frees nothing this time
	}
	var freed memapi.Bytes
	for freed < t.Wanted {
		l := s.take()
		if l == (Lease{}) {
			break
		}
		if l.Authority() != t.Authority {
			s.put(l)
			break
		}
		n := l.Bytes()
		if mode == 1 {
			if err := l.MarkPending(l.charged()); err != nil {
				return freed, err
			}
			s.mu.Lock()
			s.pending = append(s.pending, l)
			s.mu.Unlock()
		} else {
			l.release()
		}
		freed += n
	}
	return freed, nil
}

func TestStressConcurrentLedger(t *testing.T) {
	defer goleak.VerifyNone(t)
	auths := []memapi.AuthorityID{"host", "cuda:0"}
	const capacity, hotAuth, hotCapacity = 256 << 10, memapi.AuthorityID("hot"), 48 << 10
	g := New(Options{})
	for _, a := range auths {
		if err := g.AddAuthority(a, capacity); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.AddAuthority(hotAuth, hotCapacity); err != nil {
		t.Fatal(err)
	}
	capacityOf := func(a memapi.AuthorityID) memapi.Bytes {
		if a == hotAuth {
			return hotCapacity
		}
		return capacity
	}
	holders := make([]*stressHolder, 4)
	ids := make([]HolderID, 4)
	for i := range holders {
		holders[i] = &stressHolder{rng: rand.New(rand.NewPCG(uint64(i), 1))}
		ids[i] = HolderID(fmt.Sprintf("h%d", i))
		opts := HolderOptions{Priority: int(i % 2)}
		if i == 3 {
			opts.Guarantee = map[memapi.AuthorityID]memapi.Bytes{"host": 32 << 10}
			opts.Limit = map[memapi.AuthorityID]memapi.Bytes{"host": 128 << 10}
		}
		if err := g.Register(ids[i], holders[i], opts); err != nil {
			t.Fatal(err)
		}
	}

	// A watcher takes snapshots throughout: the identity holds at every
	// instant.
	stopWatch := make(chan struct{})
	watchErr := make(chan error, 1)
	go func() {
		defer close(watchErr)
		for {
			select {
			case <-stopWatch:
				return
			default:
			}
			for _, a := range g.Snapshot().Authorities {
				if !a.Balanced() || a.Capacity != capacityOf(a.ID) {
					watchErr <- fmt.Errorf("unbalanced snapshot: %+v", a)
					return
				}
			}
			time.Sleep(50 * time.Microsecond)
		}
	}()

	workers, iters := 16, 300
	if testing.Short() {
		iters = 60
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers+4)
	var outcomes [6]int64
	var omu sync.Mutex
	count := func(i int) { omu.Lock(); outcomes[i]++; omu.Unlock() }
	// Hot loops on their own authority, too small for all four: the same
	// reservation over and over, whole refunds in between, racing with
	// the snapshots and with the reservations that wait.
	var hot [4]int64
	for i := range hot {
		wg.Go(func() {
			size := memapi.Bytes(4<<10) << i
			for range iters * 10 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
				gr, err := g.Reserve(ctx, Request{Authority: hotAuth, Holder: ids[i], Role: "hot", Bytes: size, Priority: 1})
				cancel()
				if err != nil {
					var ob *OverBudgetError
					if !errors.As(err, &ob) {
						errs <- err
						return
					}
					continue
				}
				if err := gr.Draw(size); err != nil {
					errs <- err
					return
				}
				l, err := gr.Commit()
				if err != nil {
					errs <- err
					return
				}
				if err := l.Refund(size); err != nil {
					errs <- err
					return
				}
				hot[i]++
			}
		})
	}
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			for range iters {
				hi := rng.IntN(len(holders))
				hd := holders[hi]
				switch rng.IntN(5) {
				case 0: // free memory: refund part, mark part pending, complete pendings
					if l := hd.takePending(); l != (Lease{}) {
						l.release()
					}
					if l := hd.take(); l != (Lease{}) {
						if n := l.charged(); n > 1 && rng.IntN(2) == 0 {
							if err := l.MarkPending(n / 2); err != nil {
								errs <- err
								return
							}
							if err := l.Refund(n/2 + 1); err != nil { // pending first, then 1 charged
								errs <- err
								return
							}
							hd.put(l)
						} else {
							l.release()
						}
					}
					continue
				}
				a := auths[rng.IntN(len(auths))]
				size := memapi.Bytes(1 + rng.IntN(48<<10))
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rng.IntN(10))*time.Millisecond)
				var deadline time.Time
				if rng.IntN(3) == 0 {
					deadline = time.Now().Add(time.Duration(rng.IntN(3000)) * time.Microsecond)
				}
				if rng.IntN(8) == 0 {
					cancel() // some waits are cancelled before they start
				}
				gr, err := g.Reserve(ctx, Request{Authority: a, Holder: ids[hi], Role: "stress", Bytes: size, Priority: int(rng.IntN(3)), Deadline: deadline})
				cancel()
				if err != nil {
					var ob *OverBudgetError
					switch {
					case errors.As(err, &ob):
						count(0)
					case errors.Is(err, memapi.ErrGrantClosed): // deadline passed before the call
						count(1)
					default:
						errs <- err
						return
					}
					continue
				}
				count(2)
				drawn := memapi.Bytes(rng.IntN(int(size) + 1))
				if err := gr.Draw(drawn); err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						errs <- err
						return
					}
					drawn = 0
				}
				if rng.IntN(4) == 0 {
					// A failed step: roll back (undraw) then cancel.
					if err := gr.Undraw(drawn); err != nil {
						errs <- err
						return
					}
					if err := gr.Cancel(); err != nil {
						errs <- err
						return
					}
					count(3)
					continue
				}
				l, err := gr.Commit()
				if err != nil {
					// Expired between draw and commit: the drawn bytes
					// are still reserved until rolled back.
					if !errors.Is(err, context.DeadlineExceeded) {
						errs <- err
						return
					}
					if err := gr.Refund(drawn); err != nil {
						errs <- err
						return
					}
					count(4)
					continue
				}
				count(5)
				hd.put(l)
			}
		})
	}
	watchdog.Within(t, bound, "the stress workers", wg.Wait)
	close(stopWatch)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := watchdog.Recv(t, bound, "the watcher", watchErr); err != nil {
		t.Fatal(err)
	}
	// Everyone releases what they hold; every figure is back to its start.
	for _, hd := range holders {
		for l := hd.takePending(); l != (Lease{}); l = hd.takePending() {
			l.release()
		}
		for l := hd.take(); l != (Lease{}); l = hd.take() {
			l.release()
		}
	}
	s := g.Snapshot()
	for _, a := range s.Authorities {
		if !a.Balanced() || a.Free != capacityOf(a.ID) || a.Reserved != 0 || a.Charged != 0 || a.Pending != 0 ||
			a.ExpiredDrawn != 0 || a.Waiters != 0 || a.WaitingBytes != 0 || a.Asking != 0 || a.Grants != 0 || a.Leases != 0 {
			t.Fatalf("authority not back to its start: %+v", a)
		}
	}
	for _, h := range s.Holders {
		for _, ha := range h.Authorities {
			if ha.Reserved+ha.Charged+ha.Pending+ha.Waiting != 0 || ha.Grants != 0 || ha.Leases != 0 {
				t.Fatalf("holder %s not back to its start: %+v", h.ID, ha)
			}
		}
	}
	var tickets uint64
	for _, a := range s.Authorities {
		tickets += a.Tickets
		// Every grant made is counted once.
		if want := uint64(hot[0] + hot[1] + hot[2] + hot[3]); a.ID == hotAuth && a.Granted != want {
			t.Fatalf("granted %d on %s, want %d", a.Granted, a.ID, want)
		}
	}
	t.Logf("outcomes: over-budget %d, past-deadline %d, granted %d (cancelled %d, expired %d, committed %d); tickets %d; hot cycles %v",
		outcomes[0], outcomes[1], outcomes[2], outcomes[3], outcomes[4], outcomes[5], tickets, hot)
	if outcomes[5] == 0 || tickets == 0 || outcomes[0] == 0 {
		t.Fatalf("the stress did not reach pressure: %v, %d tickets", outcomes, tickets)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
}
