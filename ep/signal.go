package ep

// zeroSignal is a channel that is closed while a count is zero, made only
// when a waiter asks for it while the count is not: a count that leaves
// zero and comes back (a pin and its unpin, a release enqueued and run)
// allocates nothing when nobody waits. It is guarded by its owner's mutex.
type zeroSignal struct {
	ch chan struct{} // closedChan while zero; nil while not and nobody asked
}

// closedChan is the channel of every count at zero.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// busy records that the count left zero.
func (z *zeroSignal) busy() { z.ch = nil }

// done records that the count reached zero: a waiter's channel is closed.
func (z *zeroSignal) done() {
	if z.ch != nil && z.ch != closedChan {
		close(z.ch)
	}
	z.ch = closedChan
}

// wait returns the channel closed when the count is zero (at once if it is).
func (z *zeroSignal) wait() chan struct{} {
	if z.ch == nil {
		z.ch = make(chan struct{})
	}
	return z.ch
}
