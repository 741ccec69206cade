package xproc

import (
	"errors"

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
// and at least every Poll, it reclaims the slots of dead owners, opens
// pidfds on owners that joined since, and settles the bound authority
// (publishes its figures, gives its spare claim back, answers pressure).
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
		_, err := unix.Poll(pfd, int(l.poll.Milliseconds()))
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
		if err := l.lock(); err != nil {
			if errors.Is(err, ErrClosed) {
				return
			}
			continue // a file someone truncated: every use reports it; keep watching
		}
		var ev []Event
		for i := 0; i < l.slots; i++ {
			pid, start := int(l.load(l.sw(i, sPID))), l.load(l.sw(i, sStart))
			w, ok := fds[i]
			if ok && (w.pid != pid || w.start != start || exited[i]) {
				unix.Close(w.fd)
				delete(fds, i)
				if w.pid == pid && w.start == start {
					// This slot's owner exited.
					ev = append(ev, l.reclaimLocked(i))
					continue
				}
			}
			if pid == 0 || i == l.slot {
				continue
			}
			if _, ok := fds[i]; ok {
				continue
			}
			fd := watchProcess(pid, start)
			if fd < 0 {
				ev = append(ev, l.reclaimLocked(i))
				continue
			}
			fds[i] = watched{fd: fd, pid: pid, start: start}
		}
		if rev := l.load(l.hw(hRevision)); rev != seenRev {
			ev = append(ev, Event{Kind: EventLimits, Revision: rev, Capacity: l.load(l.hw(hCapacity))})
			seenRev = rev
		}
		l.unlock()
		l.emitAll(ev)
		// After the reclaims, so a death is never delayed behind an
		// answer to pressure (which may take one Poll).
		if a := l.auth.Load(); a != nil {
			_ = a.settle() // its failures are Settle's callers' to see; the watcher tries again next Poll
		}
	}
}
