package xproc

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// watched is a pidfd held on the owner of another slot.
type watched struct {
	fd    int
	pid   int
	start uint64
}

// watch is the watcher goroutine: it holds a pidfd on the owner of every
// other slot and polls them with the stop eventfd. A pidfd turns readable
// when its process exits, so a death wakes the watcher at once; each wake,
// and at least every Poll, it reclaims the slots of dead owners and opens
// pidfds on owners that joined since. It does nothing else: the settle
// (and the answers to other processes' wants, which may take a Poll) runs
// in the settler, so a death is never reclaimed behind an answer. Each
// round waits for the lock at most the ledger's LockTimeout: behind a
// stopped lock holder it tries again next round, and Close ends the wait.
func (l *Ledger) watch() {
	defer close(l.done)
	fds := map[int]watched{} // slot -> pidfd
	defer func() {
		for _, w := range fds {
			unix.Close(w.fd)
		}
	}()
	seenRev := l.joinRev
	l.emitAll(l.joinEvents)
	for {
		pfd := []unix.PollFd{{Fd: int32(l.stop), Events: unix.POLLIN}}
		slots := []int{-1}
		for i, w := range fds {
			pfd = append(pfd, unix.PollFd{Fd: int32(w.fd), Events: unix.POLLIN})
			slots = append(slots, i)
		}
		// A signal (SIGCHLD, say) is no wake: poll again until the
		// period ends, so each round is a death, a stop or a Poll.
		end := time.Now().Add(l.poll)
		var err error
		for {
			_, err = unix.Poll(pfd, int(max(time.Until(end), 0).Milliseconds()))
			if err != unix.EINTR || !time.Now().Before(end) {
				break
			}
		}
		if err != nil && err != unix.EINTR {
			return
		}
		if pfd[0].Revents != 0 {
			return
		}
		exited := map[int]bool{}
		for k := 1; k < len(pfd); k++ {
			if pfd[k].Revents != 0 {
				exited[slots[k]] = true
			}
		}
		// Outside the lock: a pidfd (and the /proc read that checks it
		// names the slot's owner) on each owner not watched yet. Under
		// the lock, each is kept, or its slot reclaimed, only while the
		// slot still names that owner.
		var fresh []struct {
			slot int
			w    watched
		}
		for i := 0; i < l.slots; i++ {
			pid, start := int(l.load(l.sw(i, sPID))), l.load(l.sw(i, sStart))
			if pid == 0 || i == l.slot {
				continue
			}
			if w, ok := fds[i]; ok && w.pid == pid && w.start == start {
				continue
			}
			fresh = append(fresh, struct {
				slot int
				w    watched
			}{i, watched{fd: watchProcess(pid, start), pid: pid, start: start}})
		}
		var closing []int // pidfds closed once the lock is dropped
		ctx, cancel := context.WithTimeout(l.ctx, l.lockTimeout)
		err = l.lock(ctx, "xproc.watch")
		cancel()
		if err != nil {
			for _, f := range fresh {
				if f.w.fd >= 0 {
					unix.Close(f.w.fd)
				}
			}
			if errors.Is(err, errClosed) || l.ctx.Err() != nil {
				return
			}
			continue // a stopped lock holder, a file someone truncated: every use reports it; keep watching
		}
		var ev []event
		for i, w := range fds {
			m := slotOwner{slot: i, pid: w.pid, start: w.start}
			if l.holdsLocked(m) && !exited[i] {
				continue
			}
			closing = append(closing, w.fd)
			delete(fds, i)
			if l.holdsLocked(m) {
				ev = append(ev, l.reclaimLocked(i)) // this slot's owner exited
			}
		}
		for _, f := range fresh {
			w := f.w
			m := slotOwner{slot: f.slot, pid: w.pid, start: w.start}
			switch _, watching := fds[m.slot]; {
			case !l.holdsLocked(m) || watching:
				if w.fd >= 0 {
					closing = append(closing, w.fd) // the slot changed meanwhile: the next round looks again
				}
			case w.fd < 0:
				ev = append(ev, l.reclaimLocked(m.slot))
			default:
				fds[m.slot] = w
				if f := l.watching.Load(); f != nil {
					(*f)(m.slot, w.pid)
				}
			}
		}
		if rev := l.load(l.hw(hRevision)); rev != seenRev {
			ev = append(ev, event{Kind: eventLimits, Revision: rev, Capacity: l.load(l.hw(hCapacity))})
			seenRev = rev
		}
		l.unlock()
		for _, fd := range closing {
			unix.Close(fd)
		}
		l.emitAll(ev)
	}
}

// settle is the settler goroutine of a bound authority: every Poll it
// settles (publishes the figures, answers other processes' wants, claims
// for the local waiters, gives the spare claim back), waiting for the lock
// at most the ledger's LockTimeout, until Close.
func (l *Ledger) settle(a *authority) {
	defer close(l.settled)
	t := time.NewTicker(l.poll)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(l.ctx, l.lockTimeout)
		_ = a.settle(ctx) // its failures are Settle's callers' to see; the settler tries again next Poll
		cancel()
	}
}
