package xproc

import (
	"os"
	"testing"
)

// TestReclaimTakesEverySlotFigureOut: the slot of a dead process (an
// earlier owner of this PID) holding every kind of figure is reclaimed
// when a member joins: each of the header's totals drops by exactly what
// that slot held (claimed, reserved, charged, pending, private), and the
// live slot's figures are all that remain.
func TestReclaimTakesEverySlotFigureOut(t *testing.T) {
	b := image(4, 1000)
	dead := [...]uint64{sClaim: 400, sReserved: 50, sCharged: 100, sPending: 70, sPrivate: 30}
	live := [...]uint64{sClaim: 200, sReserved: 10, sCharged: 20, sPending: 5, sPrivate: 15}
	putSlot(b, 0, sPID, uint64(os.Getpid()))
	putSlot(b, 0, sStart, startTime(os.Getpid())+1) // an earlier owner of this PID
	putSlot(b, 1, sPID, uint64(os.Getpid()))
	putSlot(b, 1, sStart, startTime(os.Getpid())) // this process: alive
	for _, w := range []int{sClaim, sReserved, sCharged, sPending, sPrivate} {
		putSlot(b, 0, w, dead[w])
		putSlot(b, 1, w, live[w])
	}
	put(b, hClaimed, dead[sClaim]+live[sClaim])
	put(b, hReserved, dead[sReserved]+live[sReserved])
	put(b, hCharged, dead[sCharged]+live[sCharged])
	put(b, hPending, dead[sPending]+live[sPending])
	put(b, hPrivate, dead[sPrivate]+live[sPrivate])
	seal(b)
	path := ledgerPath(t)
	writeFile(t, path, b)
	events := make(chan event, 4)
	l, err := Open(path, Options{onEvent: func(e event) { events <- e }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	e := <-events
	if e.Kind != eventReclaimed || e.Slot != 0 || e.Claim != 400 || e.Reserved != 50 || e.Charged != 100 || e.Pending != 70 || e.Private != 30 {
		t.Fatalf("event %+v", e)
	}
	h, _ := inspect(t, path)
	if h.Claimed != 200 || h.Reserved != 10 || h.Charged != 20 || h.Pending != 5 || h.Private != 15 || h.Reclaims != 1 {
		t.Fatalf("after the reclaim: %+v, want the live slot's figures alone", h)
	}
}
