package ep

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// Options configure a Queue.
type Options struct {
	// Logger receives leak reports and failed frees; nil discards them (memgen
	// never logs unasked; Stats counts both either way).
	Logger *slog.Logger
	// PollMin and PollMax bound the backoff between polling rounds of fences
	// that can only be polled. Defaults: 20µs and 2ms.
	PollMin, PollMax time.Duration
	// OnError is called (from the goroutine that ran the free: the queue's,
	// or Enqueue's caller for a release with nothing to wait for) when a
	// free fails. The
	// memory is then still held by its mechanism; the failure is also counted.
	OnError func(name string, err error)
}

// Release is one deferred free: the fences to wait for, and the free itself,
// which releases the memory through the mechanism that created it and then
// refunds the ledger.
type Release struct {
	Name   string
	Fences []memapi.Fence
	Free   func(ctx context.Context) error
	// Done (optional) is completed once Free has run, whether it failed
	// or not. A later release that depends on this one lists Done among
	// its Fences: the queue orders the two, and no Free ever waits for
	// another inside the queue's goroutine.
	Done *Completion
	// Ended (optional) is called with how Free ended (nil, its error, or
	// the panic it raised, recovered as an error), before Done completes:
	// the owner of the memory settles there whether it is freed.
	Ended func(err error)
}

// Completion is a fence that completes when a queued release has run. It
// orders releases that depend on each other (a region's Close after its
// shrinks) inside the queue.
type Completion struct {
	ch   chan struct{}
	once sync.Once
}

// NewCompletion returns a completion that is not done.
func NewCompletion() *Completion { return &Completion{ch: make(chan struct{})} }

// Done reports whether the release ran.
func (c *Completion) Done() bool {
	select {
	case <-c.ch:
		return true
	default:
		return false
	}
}

// Ready returns a channel closed when the release ran.
func (c *Completion) Ready() <-chan struct{} { return c.ch }

// Wait blocks until the release ran or ctx ends.
func (c *Completion) Wait(ctx context.Context) error {
	select {
	case <-c.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Completion) complete() { c.once.Do(func() { close(c.ch) }) }

var _ memapi.Fence = (*Completion)(nil)

// QueueStats are a queue's counters.
type QueueStats struct {
	Enqueued, Freed, Failed, Leaked uint64
	Pending                         int
}

// job is a release on the queue: a Release as Enqueue took it, or an
// owning handle's (owner), whose Free, settling and name are its
// Lifecycle's, with no closure made for them.
type job struct {
	rel      Release
	owner    *Lifecycle
	next     int  // index of the first fence not known to be done
	watching bool // a watcher waits on fence next's Ready channel
}

func (j *job) name() string {
	if j.owner != nil {
		return j.owner.Name()
	}
	return j.rel.Name
}

// Queue is the deferred-free queue of one device context. It runs one
// goroutine, plus one short-lived watcher per fence that offers a Ready
// channel, all of which end by Close.
type Queue struct {
	opts  Options
	log   *slog.Logger
	owner *Context // the context whose pins keep the queue open, or nil

	mu      sync.Mutex
	jobs    []*job
	closing bool
	closed  bool
	stats   QueueStats
	// outstanding counts releases enqueued and not yet run (waiting or
	// running); idle is closed while it is zero.
	outstanding int
	idle        chan struct{} // as Context.zero (closedChan)

	wake chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup

	// closeHook (tests only, set before Close) runs at Close's steps, so a
	// test can act in the gaps between them.
	closeHook func(closeStep)
}

// closeStep names a step of Queue.Close, for closeHook.
type closeStep uint8

const (
	stepWaitPins closeStep = iota // about to wait for the owner's pins to reach zero
	stepPinsZero                  // the owner's pins were seen at zero
	stepClosing                   // closing is set; Close drains
)

func (q *Queue) step(s closeStep) {
	if q.closeHook != nil {
		q.closeHook(s)
	}
}

// NewQueue starts a queue.
func NewQueue(opts Options) *Queue {
	if opts.PollMin <= 0 {
		opts.PollMin = 20 * time.Microsecond
	}
	if opts.PollMax < opts.PollMin {
		opts.PollMax = 2 * time.Millisecond
	}
	q := &Queue{
		opts: opts,
		log:  opts.Logger,
		idle: closedChan,
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
	}
	if q.log == nil {
		q.log = slog.New(slog.DiscardHandler)
	}
	q.wg.Add(1)
	go q.loop()
	return q
}

// Enqueue schedules r. It never blocks on the device: a release with every
// fence complete and nothing outstanding runs at once, in the caller's
// goroutine; any other waits on the queue. After Close it fails with
// memapi.ErrClosed and r is not run.
func (q *Queue) Enqueue(r Release) error {
	if r.Free == nil {
		return memapi.Errorf("ep.Enqueue", memapi.ErrInvalidSize, "release %q has no Free", r.Name)
	}
	return q.submit(job{rel: r})
}

// submit is Enqueue for a job. An inline job runs from the caller's copy:
// only a job that waits is allocated.
func (q *Queue) submit(j job) error {
	q.mu.Lock()
	if q.closed || q.closing {
		q.mu.Unlock()
		return memapi.Errorf("ep.Enqueue", memapi.ErrClosed, "queue is closed; release %q not scheduled", j.name())
	}
	// Nothing to wait for and nothing outstanding: the release runs now, in
	// the caller's goroutine, instead of a hop to the queue's goroutine and
	// back. It orders behind nothing, so the order is the queue's all the
	// same; it blocks on no device work, only on the free itself.
	inline := q.outstanding == 0
	for _, f := range j.rel.Fences {
		if f != nil && !f.Done() {
			inline = false
			break
		}
	}
	if q.outstanding == 0 { // counted outstanding until run ends it (admitLocked)
		q.idle = nil
	}
	q.outstanding++
	q.stats.Enqueued++
	if inline {
		q.mu.Unlock()
		q.run(&j)
		return nil
	}
	waiting := new(job)
	*waiting = j
	q.jobs = append(q.jobs, waiting)
	q.mu.Unlock()
	q.poke()
	return nil
}

// runUnqueued runs r, a release with no fences, in the caller's goroutine
// even once the queue is closing or closed, counted and reported like any
// other (Stats, OnError). Only a leftover that holds no pin of the owner
// (Context.OwnQuarantined on a closing context) takes this path: nothing
// orders it, and it needs none of the queue's goroutines.
func (q *Queue) runUnqueued(j job) {
	q.mu.Lock()
	q.admitLocked()
	q.mu.Unlock()
	q.run(&j)
}

// admitLocked counts a release as outstanding until run ends it.
func (q *Queue) admitLocked() {
	if q.outstanding == 0 {
		q.idle = nil
	}
	q.outstanding++
	q.stats.Enqueued++
}

func (q *Queue) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Stats returns the queue's counters.
func (q *Queue) Stats() QueueStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := q.stats
	s.Pending = q.outstanding
	return s
}

// Drain waits until no release is pending, or ctx ends.
func (q *Queue) Drain(ctx context.Context) error {
	q.mu.Lock()
	n := q.outstanding
	if n == 0 { // nothing to wait for: done, even under a cancelled ctx
		q.mu.Unlock()
		return nil
	}
	idle := zeroChan(&q.idle)
	q.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return &memapi.Error{Op: "ep.Drain", Kind: memapi.ErrInUse, Detail: pendingDetail(n), Err: ctx.Err()}
	}
}

func pendingDetail(n int) string {
	if n == 1 {
		return "1 release still waits for its fences"
	}
	return strconv.Itoa(n) + " releases still wait for their fences"
}

// Close waits until no handle of the owning context is pinned (a queue
// closed under a live handle could never release it) and every pending
// release has run, then stops the queue's goroutines. The owner's pins are
// checked and closing is set in one step under the owner's lock, and the
// owner refuses new pins from then on (memapi.ErrClosed), so no release of
// a live handle is ever refused: a handle made before that step holds Close
// until it is released, one made after it is never made. If ctx ends first
// Close returns an error of kind memapi.ErrInUse and the queue keeps
// running (and pins are accepted again), so nothing is lost; Close may be
// called again.
func (q *Queue) Close(ctx context.Context) error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.mu.Unlock()
	c := q.owner
	for {
		if c != nil {
			if pins, zero := c.pinState(); pins > 0 {
				q.step(stepWaitPins)
				select {
				case <-zero:
				case <-ctx.Done():
					return &memapi.Error{Op: "ep.Queue.Close", Kind: memapi.ErrInUse, Detail: c.pinDetail(c.Live()), Err: ctx.Err()}
				}
			}
			q.step(stepPinsZero)
		}
		started, closed := q.beginClose()
		if closed {
			return nil
		}
		if started {
			break
		}
		// Pinned again between the wait and the check: wait again.
	}
	q.step(stepClosing)
	if err := q.Drain(ctx); err != nil {
		q.endClose()
		return err
	}
	q.mu.Lock()
	if q.closed { // a concurrent Close stopped it meanwhile
		q.mu.Unlock()
		return nil
	}
	q.closed = true
	q.mu.Unlock()
	close(q.stop)
	q.wg.Wait()
	return nil
}

// beginClose sets closing if the owner (if any) has no pins, and makes the
// owner refuse new ones, in one step under the owner's lock (the order is
// the owner's lock, then the queue's; nothing takes them the other way).
// It reports whether it did, and whether the queue was closed already.
func (q *Queue) beginClose() (started, closed bool) {
	if c := q.owner; c != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.pins > 0 {
			return false, false
		}
		c.queueClosing = true
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false, true
	}
	q.closing = true
	return true, false
}

// endClose undoes beginClose after a Close that gave up.
func (q *Queue) endClose() {
	if c := q.owner; c != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.queueClosing = false
	}
	q.mu.Lock()
	q.closing = false
	q.mu.Unlock()
}

// ready removes and returns the jobs whose fences have all completed, starts
// watchers for jobs blocked on a fence with a Ready channel, and reports
// whether some job waits on a fence that can only be polled.
func (q *Queue) ready() (out []*job, polling bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	keep := q.jobs[:0]
	for _, j := range q.jobs {
		for j.next < len(j.rel.Fences) && (j.rel.Fences[j.next] == nil || j.rel.Fences[j.next].Done()) {
			j.next++
			j.watching = false
		}
		if j.next == len(j.rel.Fences) {
			out = append(out, j)
			continue
		}
		keep = append(keep, j)
		f := j.rel.Fences[j.next]
		ch := f.Ready()
		if ch == nil {
			polling = true
			continue
		}
		if !j.watching {
			j.watching = true
			q.wg.Add(1)
			go q.watch(ch)
		}
	}
	for i := len(keep); i < len(q.jobs); i++ {
		q.jobs[i] = nil
	}
	q.jobs = keep
	return out, polling
}

func (q *Queue) watch(ch <-chan struct{}) {
	defer q.wg.Done()
	select {
	case <-ch:
		q.poke()
	case <-q.stop:
	}
}

func (q *Queue) loop() {
	defer q.wg.Done()
	backoff := q.opts.PollMin
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		jobs, polling := q.ready()
		for _, j := range jobs {
			q.run(j)
		}
		if len(jobs) > 0 {
			backoff = q.opts.PollMin
			continue
		}
		if !polling {
			backoff = q.opts.PollMin
			select {
			case <-q.wake:
			case <-q.stop:
				return
			}
			continue
		}
		if timer == nil {
			timer = time.NewTimer(backoff)
		} else {
			timer.Reset(backoff)
		}
		select {
		case <-q.wake:
		case <-timer.C:
			backoff *= 2
			if backoff > q.opts.PollMax {
				backoff = q.opts.PollMax
			}
		case <-q.stop:
			return
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// run runs one release's Free and books how it ended. A panic is recovered
// and reported as the release's failure: the queue serves every handle of
// its context and must not die with one.
func (q *Queue) run(j *job) {
	var err error
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("ep: release %s panicked: %v", j.name(), p)
		}
		if j.owner != nil {
			j.owner.ended(err)
		} else if j.rel.Ended != nil {
			j.rel.Ended(err)
		}
		if j.rel.Done != nil {
			j.rel.Done.complete()
		}
		if err != nil {
			q.log.Error("memgen: deferred free failed; the memory is still held", "release", j.name(), "err", err)
			if q.opts.OnError != nil {
				q.opts.OnError(j.name(), err)
			}
		}
		q.mu.Lock()
		if err != nil {
			q.stats.Failed++
		} else {
			q.stats.Freed++
		}
		q.outstanding--
		if q.outstanding == 0 {
			if q.idle != nil {
				close(q.idle)
			}
			q.idle = closedChan
		}
		q.mu.Unlock()
	}()
	if j.owner != nil {
		err = j.owner.rel.Free(context.Background())
	} else {
		err = j.rel.Free(context.Background())
	}
}
