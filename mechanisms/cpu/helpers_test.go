package cpu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"go.uber.org/goleak"

	"github.com/memgen/memgen/generated/memapi"
)

func TestMain(m *testing.M) {
	if child := os.Getenv(childEnv); child != "" {
		// A re-executed test binary runs one child scenario and exits.
		os.Exit(runChild(child))
	}
	goleak.VerifyTestMain(m)
}

var bg = context.Background()

// grant is the smallest memapi.Grant: the bare mechanism only checks that a
// consuming call has one (the checked wrapper draws from it).
type grant struct{ authority memapi.AuthorityID }

func (g grant) Authority() memapi.AuthorityID { return g.authority }
func (grant) Draw(memapi.Bytes) error         { return nil }
func (grant) Undraw(memapi.Bytes) error       { return nil }
func (g grant) Refund(memapi.Bytes) error     { return nil }

var g = grant{authority: DefaultAuthority}

const (
	kib = memapi.Bytes(1) << 10
	mib = memapi.Bytes(1) << 20
)

// newMech returns a mechanism with the given granularity whose cleanup
// fails the test when anything is still held, and checks that the kernel
// agrees with the mechanism's accounting before that.
func newMech(t testing.TB, gran memapi.Bytes) *Mechanism {
	t.Helper()
	return newMechWith(t, Options{Granularity: gran})
}

// newMechWith is newMech with any options.
func newMechWith(t testing.TB, o Options) *Mechanism {
	t.Helper()
	m, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s := m.Stats(); s != (Stats{}) {
			t.Errorf("mechanism still holds %+v at the end of the test", s)
		}
		if u := m.UsedBytes(); u != 0 {
			t.Errorf("UsedBytes = %d at the end of the test, want 0", u)
		}
	})
	return m
}

// newStream returns a stream of a fresh context, closed at cleanup.
func newStream(t testing.TB, m *Mechanism) memapi.Stream {
	t.Helper()
	c := NewContext(m)
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("stream close: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("context close: %v", err)
		}
	})
	return s
}

// write copies data to addr through the stream and returns the error of the
// copy.
func write(s memapi.Stream, addr memapi.DeviceAddr, data []byte) error {
	if err := s.CopyToDevice(addr, data); err != nil {
		return err
	}
	return s.Synchronize(bg)
}

// read returns n bytes at addr through the stream.
func read(t testing.TB, s memapi.Stream, addr memapi.DeviceAddr, n memapi.Bytes) []byte {
	t.Helper()
	b := make([]byte, n)
	if err := s.CopyFromDevice(b, addr); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(bg); err != nil {
		t.Fatalf("read %#x+%d: %v", addr, n, err)
	}
	return b
}

// pattern returns n bytes of a pattern seeded by seed, with no zero byte.
func pattern(n memapi.Bytes, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7+int(seed))%251 + 1
	}
	return b
}

func allZero(b []byte) bool {
	return bytes.Count(b, []byte{0}) == len(b)
}

// wantKind fails the test unless err is a *memapi.Error of kind.
func wantKind(t testing.TB, err error, kind error) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", kind)
	}
	if !errors.Is(err, kind) {
		t.Fatalf("got %v, want kind %v", err, kind)
	}
	var me *memapi.Error
	if !errors.As(err, &me) {
		t.Fatalf("%v is not a *memapi.Error", err)
	}
}

// checkKernel fails the test unless the kernel (mincore, memfd blocks)
// reports exactly the bytes the mechanism accounts for.
func checkKernel(t testing.TB, m *Mechanism) {
	t.Helper()
	k, err := m.KernelBytes()
	if err != nil {
		t.Fatal(err)
	}
	if u := m.UsedBytes(); k != u {
		t.Fatalf("kernel reports %d bytes resident, mechanism accounts %d", k, u)
	}
}

// residentAt is mincore over [addr, addr+n) of a mapping of m.
func residentAt(t testing.TB, m *Mechanism, addr memapi.DeviceAddr, n memapi.Bytes) memapi.Bytes {
	t.Helper()
	m.mu.RLock()
	rg := m.lookup(uint64(addr))
	m.mu.RUnlock()
	if rg == nil {
		t.Fatalf("%#x is not a mapping of the mechanism", addr)
	}
	r, err := mincore(unsafe.Add(rg.ptr, uint64(addr)-rg.base), uintptr(n))
	if err != nil {
		t.Fatal(err)
	}
	return memapi.Bytes(r)
}

// mapping is one line of /proc/self/maps.
type mapping struct {
	start, end uint64
	perms      string
	path       string
}

// mapsCovering returns the lines of /proc/self/maps that overlap
// [start, end), in order.
func mapsCovering(t testing.TB, start, end uint64) []mapping {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		se := strings.SplitN(fields[0], "-", 2)
		s, _ := strconv.ParseUint(se[0], 16, 64)
		e, _ := strconv.ParseUint(se[1], 16, 64)
		if e <= start || s >= end {
			continue
		}
		mp := mapping{start: s, end: e, perms: fields[1]}
		if len(fields) > 5 {
			mp.path = strings.Join(fields[5:], " ")
		}
		out = append(out, mp)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkNoHole fails the test unless [start, end) is fully mapped with no
// gap: what a reservation must always be, whatever views came and went.
func checkNoHole(t testing.TB, start, end uint64) []mapping {
	t.Helper()
	ms := mapsCovering(t, start, end)
	pos := start
	for _, mp := range ms {
		if mp.start > pos {
			t.Fatalf("hole in the reservation at [%#x, %#x): %v", pos, mp.start, ms)
		}
		pos = mp.end
	}
	if pos < end {
		t.Fatalf("hole in the reservation at [%#x, %#x): %v", pos, end, ms)
	}
	return ms
}

func (mp mapping) String() string {
	return fmt.Sprintf("%#x-%#x %s %s", mp.start, mp.end, mp.perms, mp.path)
}

// smapsField returns the value of field in the /proc/self/smaps entry of the
// mapping that holds addr.
func smapsField(addr uint64, field string) (string, error) {
	data, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return "", err
	}
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if se := strings.SplitN(fields[0], "-", 2); len(se) == 2 && !strings.HasSuffix(fields[0], ":") {
			s, err1 := strconv.ParseUint(se[0], 16, 64)
			e, err2 := strconv.ParseUint(se[1], 16, 64)
			if err1 == nil && err2 == nil {
				in = s <= addr && addr < e
				continue
			}
		}
		if in && fields[0] == field+":" {
			return strings.Join(fields[1:], " "), nil
		}
	}
	return "", fmt.Errorf("no %s for %#x in smaps", field, addr)
}

// contains reports whether the space-separated list holds word.
func contains(list, word string) bool {
	for _, w := range strings.Fields(list) {
		if w == word {
			return true
		}
	}
	return false
}
