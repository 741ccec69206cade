package xproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"

	"github.com/memgen/memgen/governor"
)

// childHoldLock: join, take the ledger's lock, say "locked", and keep it
// until the parent's line; then leave on EOF.
func childHoldLock() error {
	l, err := Open(os.Getenv(pathEnv), Options{Poll: 20 * time.Millisecond})
	if err != nil {
		return err
	}
	if err := l.lock(context.Background(), "test"); err != nil {
		return err
	}
	fmt.Println("locked")
	waitLine()
	l.unlock()
	waitEOF()
	if err := l.Close(); err != nil {
		return err
	}
	fmt.Println("done")
	return nil
}

// bounded runs f in a goroutine and waits for it at most d (a watchdog,
// minutes): how long it took, a channel closed once f returned, and its
// error ("watchdog: still blocked" when it did not return within d). How
// long it took is logged, never judged: speed belongs to benchmarks.
func bounded(d time.Duration, f func() error) (took time.Duration, done chan struct{}, err error) {
	done = make(chan struct{})
	res := make(chan error, 1)
	start := time.Now()
	go func() { res <- f(); close(done) }()
	select {
	case err = <-res:
		return time.Since(start), done, err
	case <-time.After(d):
		return d, done, fmt.Errorf("watchdog: still blocked after %v", d)
	}
}

// A process stopped (SIGSTOP) while it holds the ledger's lock: the others
// give up at their deadlines, with the typed error naming it as stopped.
func TestStoppedLockHolder(t *testing.T) {
	path := ledgerPath(t)
	_, a, _ := member(t, path, 1<<20, Options{Create: &CreateOptions{Capacity: 1 << 20, Slots: 8}})
	p := spawn(t, "holdlock", pathEnv+"="+path)
	p.expect(t, "locked")
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var waits []chan struct{}
	defer func() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		fmt.Fprintln(p.in, "go")
		for _, d := range waits {
			<-d
		}
		p.finish(t)
	}()
	const deadline = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	took, d, err := bounded(watchdog.Bound, func() error {
		_, err := a.Reserve(ctx, governor.Request{Holder: "h", Role: "r", Bytes: 512 << 10})
		return err
	})
	waits = append(waits, d)
	t.Logf("reserve: %v after %v", err, took)
	if !errors.Is(err, memapi.ErrOverBudget) {
		t.Errorf("a reservation with a %v deadline behind a stopped lock holder: %v after %v", deadline, err, took)
	}
	stopped(t, "reserve", err, p.pid)
	const short = 300 * time.Millisecond
	for _, c := range []struct {
		name string
		f    func(ctx context.Context) error
	}{
		{"inspect", func(ctx context.Context) error { _, _, err := InspectContext(ctx, path); return err }},
		{"open", func(ctx context.Context) error {
			l, err := OpenContext(ctx, path, Options{})
			if err == nil {
				l.Close()
			}
			return err
		}},
		{"set-capacity", func(ctx context.Context) error { _, err := SetCapacity(ctx, path, 2<<20, 0); return err }},
		{"settle", func(ctx context.Context) error { return a.settle(ctx) }},
		{"open (no context: LockTimeout)", func(context.Context) error {
			l, err := Open(path, Options{LockTimeout: short})
			if err == nil {
				l.Close()
			}
			return err
		}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), short)
		took, d, err := bounded(watchdog.Bound, func() error { return c.f(ctx) })
		cancel()
		waits = append(waits, d)
		t.Logf("%s: %v after %v", c.name, err, took)
		if err == nil {
			t.Errorf("%s behind a stopped lock holder: %v after %v", c.name, err, took)
		}
		stopped(t, c.name, err, p.pid)
	}
}

// stopped checks that err is the lock's typed error naming pid as stopped.
func stopped(t *testing.T, name string, err error, pid int) {
	t.Helper()
	var le *lockError
	if !errors.As(err, &le) || !errors.Is(err, errLockTimeout) {
		t.Errorf("%s: %v, want a *LockError", name, err)
		return
	}
	if len(le.Holders) != 1 || le.Holders[0].PID != pid || le.Holders[0].State != "stopped" {
		t.Errorf("%s: holders %+v, want pid %d stopped", name, le.Holders, pid)
	}
}

// A reservation with no deadline anywhere (context.Background(), no
// Request.Deadline) behind a stopped lock holder ends with the lock's
// typed error naming the stopped process: within the ledger's LockTimeout,
// and within the governor's DefaultWait when that is the shorter bound
// (then the error says so: "Options.DefaultWait").
func TestBackgroundReserveBehindAStoppedHolder(t *testing.T) {
	for _, c := range []struct {
		name        string
		lockTimeout time.Duration
		defaultWait time.Duration
		says        string
	}{
		{"lock timeout", 300 * time.Millisecond, 0, "lock"},
		{"default wait", time.Hour, 300 * time.Millisecond, "Options.DefaultWait"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := ledgerPath(t)
			l, err := Open(path, Options{Create: &CreateOptions{Capacity: 1 << 20, Slots: 8}, Poll: 20 * time.Millisecond, LockTimeout: c.lockTimeout})
			if err != nil {
				t.Fatal(err)
			}
			g := governor.New(governor.Options{DefaultWait: c.defaultWait})
			a, err := l.bind(g, "dev")
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Register("h", nil, governor.HolderOptions{}); err != nil {
				t.Fatal(err)
			}
			p := spawn(t, "holdlock", pathEnv+"="+path)
			p.expect(t, "locked")
			if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			var done chan struct{}
			defer func() {
				_ = p.cmd.Process.Signal(syscall.SIGCONT)
				fmt.Fprintln(p.in, "go")
				if done != nil {
					<-done
				}
				p.finish(t)
				if err := l.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				g.Close()
			}()
			took, d, err := bounded(watchdog.Bound, func() error {
				_, err := a.Reserve(context.Background(), governor.Request{Holder: "h", Role: "r", Bytes: 512 << 10})
				return err
			})
			done = d
			t.Logf("reserve: %v after %v", err, took)
			if !errors.Is(err, memapi.ErrOverBudget) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), c.says) {
				t.Errorf("a reservation with no deadline behind a stopped lock holder: %v after %v, want over budget past a deadline, saying %q", err, took, c.says)
			}
			stopped(t, "reserve", err, p.pid)
		})
	}
}
