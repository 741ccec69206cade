package cuda

import (
	"time"

	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// Clearing is ordered before whatever runs after the call that cleared.
// Commit and a backing's first MapView clear their memory with cuMemsetD8 on
// the legacy stream, which returns before the device has finished it. Work
// on the legacy stream and on blocking streams is ordered after it anyway,
// but a stream made with CU_STREAM_NON_BLOCKING "may run concurrently with
// work in stream 0" (driver API, cuStreamCreate): an execution provider's
// kernel there could read the old bytes, or have its first writes cleared.
// So those calls synchronize: they record an event on the legacy stream
// after the clear and return only once it has completed. The wait polls
// cuEventQuery with a backoff, as a fence's Wait does, so the device thread
// stays free for other calls meanwhile; it cannot be cancelled (the memory
// is mapped and being cleared by then), and lasts as long as the clear and
// the legacy stream's work before it. A fault seen there fails the call and
// undoes it.

// recordClear records an event on the legacy stream after the clear that is
// x's last step, on the device thread, and queries it at once. It returns
// the event while the clear is running, or 0 when it is over already. On a
// failure it rolls x back.
func (m *Mechanism) recordClear(x *txn) (driver.Event, error) {
	t := x.t
	var ev driver.Event
	if err := x.step("cuEventCreate", t.EventCreate(&ev, driver.EventDisableTiming), nil); err != nil {
		return 0, err
	}
	if err := check(t, "cuEventRecord", t.EventRecord(ev, 0)); err != nil {
		_ = t.EventDestroy(ev)
		x.rollback()
		return 0, err
	}
	return m.clearDone(x, ev)
}

// clearDone queries the clear's event on the device thread: it returns ev
// while the clear runs; otherwise it destroys ev and returns 0, or, when the
// query failed, the error after rolling x back.
func (m *Mechanism) clearDone(x *txn, ev driver.Event) (driver.Event, error) {
	t := x.t
	r := t.EventQuery(ev)
	if r == driver.ErrNotReady {
		return ev, nil
	}
	_ = t.EventDestroy(ev)
	if err := check(t, "cuEventQuery", r); err != nil {
		x.rollback()
		return 0, err
	}
	return 0, nil
}

// awaitClear waits, off the device thread, until the clear of ev (from
// recordClear) has completed; nothing when ev is 0.
func (m *Mechanism) awaitClear(x *txn, ev driver.Event) error {
	for d := pollMin; ev != 0; d = min(2*d, pollMax) {
		time.Sleep(d)
		if err := m.dev.do(func(*driver.Table) error {
			var err error
			ev, err = m.clearDone(x, ev)
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}
