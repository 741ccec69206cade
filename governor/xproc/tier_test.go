package xproc

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
)

// mine is this process's slot in slots.
func mine(t *testing.T, slots []Slot) Slot {
	t.Helper()
	for _, s := range slots {
		if s.PID == os.Getpid() {
			return s
		}
	}
	t.Fatalf("no slot of pid %d in %+v", os.Getpid(), slots)
	return Slot{}
}

// Note writes the host tier's bytes, the sleep state, the count of each
// kind and the last move into the slot, where Inspect reads them; a bad
// note is refused and changes nothing; after Close nothing is noted.
func TestNote(t *testing.T) {
	path := ledgerPath(t)
	l, err := Open(path, Options{Create: &CreateOptions{Capacity: 1 << 30, Slots: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, s := inspect(t, path)
	if m := mine(t, s); m.Host != 0 || m.Asleep != 0 || m.Sleeps|m.Wakes|m.Offloads|m.Restores != 0 || m.Last != (TierEvent{}) {
		t.Fatalf("a new slot: %+v", m)
	}
	at := time.Unix(1_800_000_000, 123)
	steps := []struct {
		e       TierEvent
		host    uint64
		asleep  int
		counts  [4]uint64 // sleeps, wakes, offloads, restores
		lastKnd string
	}{
		{TierEvent{Kind: "sleep", Level: 1, Bytes: 64 << 20, Host: 64 << 20, Time: at}, 64 << 20, 1, [4]uint64{1, 0, 0, 0}, "sleep"},
		{TierEvent{Kind: "wake", Level: 1, Bytes: 64 << 20, Host: 0}, 0, 0, [4]uint64{1, 1, 0, 0}, "wake"},
		{TierEvent{Kind: "offload", Bytes: 8 << 20, Host: 8 << 20}, 8 << 20, 0, [4]uint64{1, 1, 1, 0}, "offload"},
		{TierEvent{Kind: "sleep", Level: 2, Bytes: 70 << 20, Host: 8 << 20}, 8 << 20, 2, [4]uint64{2, 1, 1, 0}, "sleep"},
		{TierEvent{Host: 4 << 20}, 4 << 20, 2, [4]uint64{2, 1, 1, 0}, "sleep"}, // the host bytes alone
		{TierEvent{Kind: "restore", Bytes: 8 << 20, Host: 0}, 0, 2, [4]uint64{2, 1, 1, 1}, "restore"},
	}
	for i, st := range steps {
		before := time.Now()
		if err := l.Note(st.e); err != nil {
			t.Fatalf("step %d: Note(%+v): %v", i, st.e, err)
		}
		_, s := inspect(t, path)
		m := mine(t, s)
		if m.Host != st.host || m.Asleep != st.asleep || [4]uint64{m.Sleeps, m.Wakes, m.Offloads, m.Restores} != st.counts || m.Last.Kind != st.lastKnd || m.Last.Host != m.Host {
			t.Fatalf("step %d: after Note(%+v): %+v", i, st.e, m)
		}
		if st.e.Kind != "" {
			if m.Last.Level != st.e.Level || m.Last.Bytes != st.e.Bytes {
				t.Fatalf("step %d: the last move %+v, noted %+v", i, m.Last, st.e)
			}
			if want := st.e.Time; !want.IsZero() && !m.Last.Time.Equal(want) || want.IsZero() && m.Last.Time.Before(before.Round(0)) {
				t.Fatalf("step %d: the last move at %v, noted at %v (sent %v)", i, m.Last.Time, before, st.e.Time)
			}
		}
	}
	_, s = inspect(t, path)
	was := mine(t, s)
	for _, c := range []struct {
		e    TierEvent
		want error
	}{
		{TierEvent{Kind: "nap", Level: 1}, memapi.ErrUnsupported},
		{TierEvent{Kind: "sleep", Level: 3}, memapi.ErrUnsupported},
		{TierEvent{Kind: "wake"}, memapi.ErrUnsupported},
		{TierEvent{Kind: "offload", Level: 1}, memapi.ErrUnsupported},
		{TierEvent{Kind: "restore", Bytes: 1 << 60}, memapi.ErrInvalidSize},
		{TierEvent{Host: 1 << 60}, memapi.ErrInvalidSize},
	} {
		if err := l.Note(c.e); !errors.Is(err, c.want) {
			t.Errorf("Note(%+v): %v, want %v", c.e, err, c.want)
		}
	}
	if _, s := inspect(t, path); mine(t, s) != was {
		t.Fatalf("refused notes changed the slot: %+v, was %+v", mine(t, s), was)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Note(TierEvent{Kind: "offload", Bytes: 1}); !errors.Is(err, memapi.ErrClosed) {
		t.Fatalf("Note after Close: %v", err)
	}
	if _, s := inspect(t, path); s[was.Index] != (Slot{Index: was.Index}) {
		t.Fatalf("a closed member's slot: %+v", s[was.Index])
	}
}

// The tier words are sealed as every other slot word: one changed in the
// file behind the members' backs is refused (Inspect, and the next
// member's lock), and so is a sealed value no Note writes.
func TestTierWordsChecked(t *testing.T) {
	path := ledgerPath(t)
	l, err := Open(path, Options{Create: &CreateOptions{Capacity: 1 << 30, Slots: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	if err := l.Note(TierEvent{Kind: "sleep", Level: 1, Bytes: 1 << 20, Host: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(path)
	if _, _, err := parse(good); err != nil {
		t.Fatalf("a noted ledger: %v", err)
	}
	_, s := inspect(t, path)
	slot := mine(t, s).Index
	for _, w := range []int{sHost, sAsleep, sSleeps, sWakes, sOffloads, sRestores, sLast, sLastBytes, sLastTime} {
		b := append([]byte(nil), good...)
		putSlot(b, slot, w, word(b[headerSize+slot*slotSize:], w)^4)
		if _, _, err := parse(b); !errors.Is(err, errCorrupt) {
			t.Errorf("slot word %d flipped: %v, want corrupt", w, err)
		}
	}
	// Sealed, but no Note writes it.
	for name, f := range map[string]func(b []byte){
		"sleep level 3":       func(b []byte) { putSlot(b, slot, sAsleep, 3) },
		"unknown kind":        func(b []byte) { putSlot(b, slot, sLast, 9|1<<8) },
		"offload with level":  func(b []byte) { putSlot(b, slot, sLast, 3|1<<8) },
		"sleep without level": func(b []byte) { putSlot(b, slot, sLast, 1) },
		"no move, some bytes": func(b []byte) { putSlot(b, slot, sLast, 0) },
		"host beyond":         func(b []byte) { putSlot(b, slot, sHost, 1<<60) },
		"moved beyond":        func(b []byte) { putSlot(b, slot, sLastBytes, 1<<60) },
		"free slot's host":    func(b []byte) { putSlot(b, slot^1, sPID, 0); putSlot(b, slot^1, sHost, 1) },
	} {
		b := seal(append([]byte(nil), good...))
		f(b)
		if _, _, err := parse(seal(b)); !errors.Is(err, errCorrupt) {
			t.Errorf("%s: %v, want corrupt", name, err)
		}
	}
	// The member's next lock refuses a flipped word in the file.
	b := append([]byte(nil), good...)
	putSlot(b, slot, sSleeps, 7)
	writeFile(t, path, b)
	if err := l.Note(TierEvent{Kind: "wake", Level: 1}); !errors.Is(err, errCorrupt) {
		t.Fatalf("Note on a file whose count was changed: %v", err)
	}
	writeFile(t, path, good)
}

// childTier: join, note a sleep at level 2 and an offload, say "noted",
// and stay until killed.
func childTier() error {
	l, err := Open(os.Getenv(pathEnv), Options{})
	if err != nil {
		return err
	}
	if err := l.Note(TierEvent{Kind: "sleep", Level: 2, Bytes: 96 << 20, Host: 0}); err != nil {
		return err
	}
	if err := l.Note(TierEvent{Kind: "offload", Bytes: 12 << 20, Host: 12 << 20}); err != nil {
		return err
	}
	fmt.Println("noted")
	waitEOF()
	return l.Close()
}

// A dead process's tier figures go with its slot: killed with -9 after it
// noted a sleep and an offload, its slot is reclaimed whole, and nothing
// of its host tier is left to show.
func TestReclaimedTierVanishes(t *testing.T) {
	path := ledgerPath(t)
	events := make(chan event, 8)
	l, err := Open(path, Options{Create: &CreateOptions{Capacity: 1 << 30, Slots: 4}, Poll: 20 * time.Millisecond,
		onEvent: func(e event) {
			if e.Kind == eventReclaimed {
				events <- e
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := spawn(t, "tier", pathEnv+"="+path)
	p.expect(t, "noted")
	_, s := inspect(t, path)
	var theirs Slot
	for _, x := range s {
		if x.PID == p.pid {
			theirs = x
		}
	}
	if theirs.Host != 12<<20 || theirs.Asleep != 2 || theirs.Sleeps != 1 || theirs.Offloads != 1 || theirs.Last.Kind != "offload" {
		t.Fatalf("the child's slot: %+v", theirs)
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
	select {
	case e := <-events:
		if e.PID != p.pid {
			t.Fatalf("reclaimed %+v, want pid %d", e, p.pid)
		}
	case <-time.After(watchdog.Bound):
		t.Fatalf("watchdog: child %d not reclaimed within %v", p.pid, watchdog.Bound)
	}
	_, s = inspect(t, path)
	if s[theirs.Index] != (Slot{Index: theirs.Index}) {
		t.Fatalf("after the reclaim the slot holds %+v", s[theirs.Index])
	}
}
