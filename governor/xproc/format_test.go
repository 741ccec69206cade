package xproc

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// image returns a valid ledger image of n slots and the given capacity.
func image(n int, capacity uint64) []byte {
	b := make([]byte, fileSize(n))
	put(b, hMagic, magic)
	put(b, hVersion, version)
	put(b, hSlots, uint64(n))
	put(b, hCapacity, capacity)
	put(b, hRevision, 1)
	put(b, hPIDNS, pidNamespace())
	seal(b)
	return b
}

// seal writes the slots' checksums and the header's into an image.
func seal(b []byte) []byte {
	n := int(word(b, hSlots))
	for i := 0; i < n && len(b) >= fileSize(i+1); i++ {
		s := b[headerSize+i*slotSize:]
		var w [slotWords]uint64
		for k := range w {
			w[k] = word(s, k)
		}
		put(s, sSum, occupiedSum(i, &w))
	}
	put(b, hSum, headerSum(b))
	return b
}

func put(b []byte, i int, v uint64) {
	b[i*8], b[i*8+1], b[i*8+2], b[i*8+3], b[i*8+4], b[i*8+5], b[i*8+6], b[i*8+7] = le8(v)
}

func putSlot(b []byte, slot, i int, v uint64) { put(b[headerSize+slot*slotSize:], i, v) }

// Every way a file can be wrong is a typed error from Parse and from Open,
// and Open changes nothing in a file it refuses.
func TestBadLedgerFiles(t *testing.T) {
	valid := image(4, 1000)
	withSlot := func(f func(b []byte)) []byte {
		b := append([]byte(nil), valid...)
		putSlot(b, 0, sPID, 1)
		putSlot(b, 0, sClaim, 100)
		put(b, hClaimed, 100)
		f(b)
		return seal(b)
	}
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, errTruncated},
		{"short header", valid[:100], errTruncated},
		{"foreign", append([]byte("not a ledger at all"), make([]byte, 200)...), errForeign},
		{"version 1", func() []byte { b := append([]byte(nil), valid...); put(b, hVersion, 1); return seal(b) }(), errVersion},
		{"no slots", func() []byte { b := append([]byte(nil), valid...); put(b, hSlots, 0); return seal(b) }(), errCorrupt},
		{"huge slot count", func() []byte { b := append([]byte(nil), valid...); put(b, hSlots, 1<<40); return seal(b) }(), errCorrupt},
		{"truncated slots", valid[:len(valid)-1], errTruncated},
		{"trailing bytes", append(append([]byte(nil), valid...), 0), errCorrupt},
		{"capacity beyond", func() []byte { b := append([]byte(nil), valid...); put(b, hCapacity, 1<<60); return seal(b) }(), errCorrupt},
		{"checksum", func() []byte { b := append([]byte(nil), valid...); put(b, hCapacity, 999); return b }(), errCorrupt},
		{"bad dirty word", func() []byte { b := append([]byte(nil), valid...); put(b, hDirty, 77); return b }(), errCorrupt},
		{"reserved header word", func() []byte { b := append([]byte(nil), valid...); put(b, hFirstZero, 1); return seal(b) }(), errCorrupt},
		{"private beyond claim", withSlot(func(b []byte) { putSlot(b, 0, sPrivate, 101); put(b, hPrivate, 101) }), errCorrupt},
		{"want parts beyond want", withSlot(func(b []byte) { putSlot(b, 0, sWant, 10); putSlot(b, 0, sWantLeft, 11) }), errCorrupt},
		{"totals not sums", withSlot(func(b []byte) { put(b, hClaimed, 99) }), errCorrupt},
		{"free slot holds bytes", withSlot(func(b []byte) { putSlot(b, 0, sPID, 0) }), errCorrupt},
		{"use beyond claim", withSlot(func(b []byte) { putSlot(b, 0, sCharged, 101); put(b, hCharged, 101) }), errCorrupt},
		{"underflowed total", withSlot(func(b []byte) { put(b, hClaimed, ^uint64(0)-5) }), errCorrupt},
		{"reserved word set", withSlot(func(b []byte) { putSlot(b, 0, sFirstZero, 1) }), errCorrupt},
		{"slot checksum", func() []byte { b := withSlot(func([]byte) {}); putSlot(b, 0, sSeq, 1); return b }(), errCorrupt},
		{"free slot with a checksum", func() []byte { b := append([]byte(nil), valid...); putSlot(b, 1, sSum, 1); return b }(), errCorrupt},
		{"free slot with a start time", func() []byte { b := append([]byte(nil), valid...); putSlot(b, 1, sStart, 1); return seal(b) }(), errCorrupt},
		{"bad pid", withSlot(func(b []byte) { putSlot(b, 0, sPID, 1<<40) }), errCorrupt},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := parse(c.b)
			var le *ledgerError
			if !errors.Is(err, c.want) || !errors.As(err, &le) {
				t.Fatalf("Parse: %v, want a *LedgerError of %v", err, c.want)
			}
			path := ledgerPath(t)
			writeFile(t, path, c.b)
			_, err = Open(path, Options{Create: &CreateOptions{Capacity: 1}})
			if !errors.Is(err, c.want) || !errors.As(err, &le) || le.Path != path {
				t.Fatalf("Open: %v, want a *LedgerError of %v naming the path", err, c.want)
			}
			got, _ := os.ReadFile(path)
			if string(got) != string(c.b) {
				t.Fatal("Open changed a file it refused")
			}
		})
	}
	if _, _, err := parse(valid); err != nil {
		t.Fatalf("a valid image: %v", err)
	}
}

// A dirty header (a writer died between begin and end) is not refused: the
// next lock holder recomputes the totals from the slots.
func TestDirtyHeaderRepaired(t *testing.T) {
	b := image(4, 1000)
	putSlot(b, 2, sPID, 1) // pid 1 lives (init); its slot survives the scan
	putSlot(b, 2, sStart, startTime(1))
	putSlot(b, 2, sClaim, 300)
	putSlot(b, 2, sCharged, 200)
	put(b, hClaimed, 12345) // the dead writer's half-done total
	put(b, hDirty, dirtyMark(77))
	if _, _, err := parse(b); err != nil {
		t.Fatalf("Parse of a dirty header: %v", err)
	}
	path := ledgerPath(t)
	writeFile(t, path, b)
	if startTime(1) == 0 {
		t.Skip("no /proc/1/stat")
	}
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h, s := inspect(t, path)
	if h.Dirty || h.Claimed != 300 || h.Charged != 200 || h.Repairs != 1 || s[2].Claim != 300 {
		t.Fatalf("after repair: %+v", h)
	}
}

// A ledger is created with the mode asked, 0600 by default; other modes
// are refused.
func TestCreateMode(t *testing.T) {
	for _, c := range []struct {
		mode, want os.FileMode
	}{{0, 0o600}, {0o660, 0o660}} {
		path := ledgerPath(t)
		l, err := Open(path, Options{Create: &CreateOptions{Capacity: 10, Mode: c.mode, Group: os.Getgid()}})
		if err != nil {
			t.Fatal(err)
		}
		st, _ := os.Stat(path)
		l.Close()
		if st.Mode().Perm() != c.want {
			t.Fatalf("mode %v, want %v", st.Mode().Perm(), c.want)
		}
	}
	_, err := Open(ledgerPath(t), Options{Create: &CreateOptions{Capacity: 10, Mode: 0o666}})
	if !errors.Is(err, errCorrupt) {
		t.Fatalf("mode 0666: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(image(1, 1))
	f.Add(image(3, 1<<30))
	b := image(2, 100)
	putSlot(b, 1, sPID, 5)
	putSlot(b, 1, sClaim, 50)
	put(b, hClaimed, 50)
	f.Add(seal(b))
	f.Add([]byte("MMXPROC"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, s, err := parse(b)
		if err != nil {
			var le *ledgerError
			if !errors.As(err, &le) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if len(s) != h.Slots || len(b) != fileSize(h.Slots) {
			t.Fatalf("accepted %d bytes as %d slots", len(b), h.Slots)
		}
	})
}

// A slot whose PID now names a process with another start time belongs to
// a dead process (PID reuse): the next member to join reclaims it and says
// so; a slot of a live process stays.
func TestPIDReuse(t *testing.T) {
	b := image(4, 1000)
	putSlot(b, 0, sPID, uint64(os.Getpid()))
	putSlot(b, 0, sStart, startTime(os.Getpid())+1) // an earlier owner of this PID
	putSlot(b, 0, sClaim, 300)
	putSlot(b, 1, sPID, uint64(os.Getpid()))
	putSlot(b, 1, sStart, startTime(os.Getpid())) // this process: alive
	putSlot(b, 1, sClaim, 200)
	put(b, hClaimed, 500)
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
	if e.Kind != eventReclaimed || e.Slot != 0 || e.Claim != 300 {
		t.Fatalf("event %+v", e)
	}
	h, s := inspect(t, path)
	if h.Claimed != 200 || s[1].Claim != 200 || s[0].Claim != 0 || h.Reclaims != 1 || l.slot != 0 {
		t.Fatalf("after the join: %+v, slot %d", h, l.slot)
	}
}

// A file truncated under its members is a typed error at their next use,
// never a fault, and Close still shuts them down.
func TestTruncatedUnderMembers(t *testing.T) {
	path := ledgerPath(t)
	l, a, _ := member(t, path, 1000, Options{})
	if err := os.Truncate(path, 64); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reserve(context.Background(), governor.Request{Holder: "h", Role: "r", Bytes: 10}); !errors.Is(err, errTruncated) {
		t.Fatalf("Reserve: %v", err)
	}
	if err := a.Settle(); !errors.Is(err, errTruncated) {
		t.Fatalf("Settle: %v", err)
	}
	if _, _, err := Inspect(path); !errors.Is(err, errTruncated) {
		t.Fatalf("Inspect: %v", err)
	}
	if err := l.Close(); !errors.Is(err, errTruncated) {
		t.Fatalf("Close: %v", err)
	}
}

// Every bit of the header is checked: a flipped bit anywhere in it (the
// low bit of the capacity, the revision, the counters) is refused.
func TestHeaderBitFlips(t *testing.T) {
	b := image(4, 1000)
	putSlot(b, 1, sPID, 1)
	putSlot(b, 1, sClaim, 100)
	put(b, hClaimed, 100)
	put(b, hReclaims, 3)
	seal(b)
	if _, _, err := parse(b); err != nil {
		t.Fatalf("the sealed image: %v", err)
	}
	accepted := 0
	for bit := 0; bit < headerSize*8; bit++ {
		c := append([]byte(nil), b...)
		c[bit/8] ^= 1 << (bit % 8)
		if _, _, err := parse(c); err == nil {
			if accepted < 5 {
				t.Errorf("a flip of bit %d of header word %d was accepted", bit%64, bit/64)
			}
			accepted++
		}
	}
	if accepted != 0 {
		t.Fatalf("%d of %d single-bit flips of the header accepted", accepted, headerSize*8)
	}
}

// A bit flipped in the header under the members (a stray write into the
// file) is seen at their next lock: a typed ErrCorrupt, never used.
func TestCorruptedUnderMembers(t *testing.T) {
	path := ledgerPath(t)
	l, a, _ := member(t, path, 1000, Options{Poll: time.Hour})
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var w [1]byte
	if _, err := f.ReadAt(w[:], hCapacity*8); err != nil {
		t.Fatal(err)
	}
	w[0] ^= 1
	if _, err := f.WriteAt(w[:], hCapacity*8); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := a.Reserve(context.Background(), governor.Request{Holder: "h", Role: "r", Bytes: 10}); !errors.Is(err, errCorrupt) {
		t.Fatalf("Reserve: %v, want ErrCorrupt", err)
	}
	if err := a.Settle(); !errors.Is(err, errCorrupt) {
		t.Fatalf("Settle: %v, want ErrCorrupt", err)
	}
	if _, _, err := Inspect(path); !errors.Is(err, errCorrupt) {
		t.Fatalf("Inspect: %v, want ErrCorrupt", err)
	}
	if err := l.Close(); !errors.Is(err, errCorrupt) {
		t.Fatalf("Close: %v, want ErrCorrupt", err)
	}
}

// Every bit of every slot is checked: a flipped bit anywhere in an
// occupied or a free slot (a figure, the start time, the want's round) is
// refused, by Parse and by the members at their next lock.
func TestSlotBitFlips(t *testing.T) {
	b := image(2, 1000)
	putSlot(b, 1, sPID, 1)
	putSlot(b, 1, sStart, 12345)
	putSlot(b, 1, sClaim, 100)
	putSlot(b, 1, sSeq, 7)
	put(b, hClaimed, 100)
	seal(b)
	if _, _, err := parse(b); err != nil {
		t.Fatalf("the sealed image: %v", err)
	}
	accepted := 0
	for bit := headerSize * 8; bit < len(b)*8; bit++ {
		c := append([]byte(nil), b...)
		c[bit/8] ^= 1 << (bit % 8)
		if _, _, err := parse(c); err == nil {
			if accepted < 5 {
				slot, w := (bit/8-headerSize)/slotSize, (bit/8-headerSize)%slotSize/8
				t.Errorf("a flip of bit %d of slot %d's word %d was accepted", bit%64, slot, w)
			}
			accepted++
		}
	}
	if accepted != 0 {
		t.Fatalf("%d of %d single-bit flips of the slots accepted", accepted, (len(b)-headerSize)*8)
	}

	path := ledgerPath(t)
	l, a, _ := member(t, path, 1000, Options{Poll: time.Hour})
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	off := int64(headerSize + l.slot*slotSize + sSeq*8)
	var w [1]byte
	if _, err := f.ReadAt(w[:], off); err != nil {
		t.Fatal(err)
	}
	w[0] ^= 4
	if _, err := f.WriteAt(w[:], off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := a.Settle(); !errors.Is(err, errCorrupt) {
		t.Fatalf("Settle after a slot's bit flipped: %v, want ErrCorrupt", err)
	}
	if err := l.Close(); !errors.Is(err, errCorrupt) {
		t.Fatalf("Close: %v, want ErrCorrupt", err)
	}
}

// A ledger file is exactly 0600 or exactly 0660 with the configured group,
// and has one name: anything else is refused at open with ErrUnsafe,
// changing nothing.
func TestUnsafeModesAndLinks(t *testing.T) {
	mk := func(t *testing.T) string {
		path := ledgerPath(t)
		l, err := Open(path, Options{Create: &CreateOptions{Capacity: 1000}})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, mode := range []os.FileMode{0o640, 0o060, 0o620, 0o400, 0o700} {
		path := mk(t)
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		for _, open := range []func() error{
			func() error { l, err := Open(path, Options{}); closeIf(l); return err },
			func() error { _, _, err := Inspect(path); return err },
		} {
			if err := open(); !errors.Is(err, errUnsafe) {
				t.Errorf("mode %#o: %v, want ErrUnsafe", mode, err)
			}
		}
	}
	path := mk(t)
	if err := os.Link(path, path+".second-name"); err != nil {
		t.Fatal(err)
	}
	if l, err := Open(path, Options{}); !errors.Is(err, errUnsafe) {
		closeIf(l)
		t.Errorf("a ledger with two names: %v, want ErrUnsafe", err)
	}
	if _, _, err := Inspect(path); !errors.Is(err, errUnsafe) {
		t.Errorf("Inspect of a ledger with two names: %v, want ErrUnsafe", err)
	}
	// 0660 of another group than the one configured.
	path = mk(t)
	if err := os.Chmod(path, 0o660); err != nil {
		t.Fatal(err)
	}
	other := os.Getgid() + 1
	l, err := Open(path, Options{Create: &CreateOptions{Capacity: 1000, Mode: 0o660, Group: other}})
	if !errors.Is(err, errUnsafe) {
		closeIf(l)
		t.Errorf("a 0660 file of group %d, configured %d: %v, want ErrUnsafe", os.Getgid(), other, err)
	}
	l, err = Open(path, Options{Create: &CreateOptions{Capacity: 1000, Mode: 0o660, Group: os.Getgid()}})
	if err != nil {
		t.Errorf("a 0660 file of the configured group: %v", err)
	}
	closeIf(l)
}

func closeIf(l *Ledger) {
	if l != nil {
		_ = l.Close()
	}
}

// A process of another PID namespace is refused at join: the members'
// liveness is their PIDs in /proc, which name other processes there.
func TestOtherPIDNamespaceRefused(t *testing.T) {
	b := image(2, 1000)
	put(b, hPIDNS, pidNamespace()+1)
	seal(b)
	path := ledgerPath(t)
	writeFile(t, path, b)
	l, err := Open(path, Options{})
	if !errors.Is(err, errNamespace) {
		closeIf(l)
		t.Fatalf("Open from another PID namespace: %v, want ErrNamespace", err)
	}
	if _, _, err := Inspect(path); err != nil {
		t.Fatalf("Inspect (reads, joins nothing): %v", err)
	}
}

// Every failure kind matches the exported error a caller tests with
// errors.Is: ErrBadLedger for a bad file, memapi's kinds for the rest.
func TestErrorKindsMatchExportedErrors(t *testing.T) {
	for _, c := range []struct {
		kind, want error
	}{
		{errTruncated, ErrBadLedger}, {errForeign, ErrBadLedger}, {errVersion, ErrBadLedger},
		{errCorrupt, ErrBadLedger}, {errUnsafe, ErrBadLedger},
		{errFull, memapi.ErrUnavailable}, {errClosed, memapi.ErrClosed}, {errInUse, memapi.ErrInUse},
		{errNamespace, memapi.ErrUnsupported}, {errLockTimeout, context.DeadlineExceeded},
	} {
		err := ledgerErr("op", "path", c.kind, "detail")
		if !errors.Is(err, c.want) || !errors.Is(err, c.kind) {
			t.Errorf("%v does not match %v", err, c.want)
		}
	}
	if errors.Is(ledgerErr("op", "path", errFull, ""), ErrBadLedger) {
		t.Error("a full ledger reads as a bad file")
	}
}
