package xproc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
)

// cpuMember is a child's membership: the ledger, a governor whose
// authority "host" is bound to it, and a checked CPU mechanism drawing on
// that authority.
type cpuMember struct {
	l    *Ledger
	a    *authority
	g    *governor.Governor
	mech *cpu.Mechanism
	m    memapi.Mechanism
}

func joinCPU() (*cpuMember, error) {
	poll := 20 * time.Millisecond
	if d, err := time.ParseDuration(os.Getenv(pollEnv)); err == nil && d > 0 {
		poll = d
	}
	l, err := Open(os.Getenv(pathEnv), Options{Poll: poll})
	if err != nil {
		return nil, err
	}
	g := governor.New(governor.Options{})
	a, err := l.bind(g, "host")
	if err != nil {
		return nil, err
	}
	if err := g.Register("h", nil, governor.HolderOptions{}); err != nil {
		return nil, err
	}
	mech, err := cpu.New(cpu.Options{Authority: "host", NoHugePages: true})
	if err != nil {
		return nil, err
	}
	return &cpuMember{l: l, a: a, g: g, mech: mech, m: checked.Wrap(mech, g.Ledger())}, nil
}

// held is an allocation and the lease that pays for it.
type held struct {
	al *memapi.Allocation
	ls governor.Lease
}

// take reserves n bytes through the ledger, allocates them on the CPU and
// commits: the allocation happens only once the ledger admitted the bytes.
func (c *cpuMember) take(n memapi.Bytes) (held, error) {
	gr, err := c.a.Reserve(context.Background(), governor.Request{Holder: "h", Role: "r", Bytes: n})
	if err != nil {
		return held{}, err
	}
	al, err := c.m.Allocate(context.Background(), memapi.AllocRequest{Size: n}, gr)
	if err != nil {
		_ = gr.Cancel()
		return held{}, err
	}
	ls, err := gr.Commit()
	return held{al, ls}, err
}

func (c *cpuMember) free(h held) error { return c.m.Free(context.Background(), h.al, h.ls) }

// pollEnv sets a CPU member's Poll (a Go duration; 20 ms when unset).
const pollEnv = "MEMGEN_XPROC_POLL"

func seed() uint64 { s, _ := strconv.ParseUint(os.Getenv(seedEnv), 10, 64); return s }

// childReserve: join, wait for the go-ahead, then 300 random reservations
// and frees of 16 to 256 KiB against the shared capacity; at quiescence
// check that the kernel holds what the local ledger charges and report it;
// on EOF free everything and leave.
func childReserve() error {
	c, err := joinCPU()
	if err != nil {
		return err
	}
	fmt.Println("joined")
	waitLine()
	rng := rand.New(rand.NewPCG(seed(), 1))
	var hold []held
	over := 0
	for range 300 {
		if len(hold) > 0 && rng.IntN(3) == 0 {
			k := rng.IntN(len(hold))
			if err := c.free(hold[k]); err != nil {
				return err
			}
			hold = append(hold[:k], hold[k+1:]...)
			if rng.IntN(3) == 0 {
				_ = c.a.Settle()
			}
			continue
		}
		h, err := c.take(memapi.Bytes(rng.IntN(16)+1) * 16 << 10)
		if errors.Is(err, memapi.ErrOverBudget) {
			over++
			continue
		}
		if err != nil {
			return err
		}
		hold = append(hold, h)
	}
	_ = c.a.Settle()
	s, _ := c.g.Authority("host")
	kb, err := c.mech.KernelBytes()
	if err != nil {
		return err
	}
	if ub := c.mech.UsedBytes(); kb != ub || ub != s.Charged || s.Reserved != 0 || s.Pending != 0 {
		return fmt.Errorf("kernel %d, mechanism %d, local ledger charged %d reserved %d pending %d", kb, ub, s.Charged, s.Reserved, s.Pending)
	}
	fmt.Println("quiescent", os.Getpid(), uint64(kb), over)
	waitEOF()
	for _, h := range hold {
		if err := c.free(h); err != nil {
			return err
		}
	}
	if err := c.l.Close(); err != nil {
		return err
	}
	c.g.Close()
	fmt.Println("done")
	return nil
}

// monitor reads the ledger file until stop is closed and reports the
// first broken invariant: every read parses (so the totals are the slots'
// sums), and neither the charges nor the claims exceed the capacity.
func monitor(path string, stop chan struct{}) (samples int, err error) {
	for {
		select {
		case <-stop:
			return samples, nil
		default:
		}
		h, _, e := Inspect(path)
		if e != nil {
			return samples, e
		}
		if h.Charged > h.Capacity || h.Claimed > h.Capacity || h.Reserved+h.Charged+h.Pending > h.Claimed {
			return samples, fmt.Errorf("over capacity: %+v", h)
		}
		samples++
	}
}

// Eight processes reserve concurrently under one capacity: the charges
// never exceed it, and at quiescence the slots' sum equals the shared
// figures, which equal what the kernel says the mechanisms hold.
func TestEightProcesses(t *testing.T) { processes(t, "reserve", 8, 8<<20) }

// processes runs n children of scenario (reserve or pmm) under one capacity
// and checks the figures throughout and at quiescence.
func processes(t *testing.T, scenario string, n int, capacity uint64) {
	path := ledgerPath(t)
	l, err := Open(path, Options{Create: &CreateOptions{Capacity: capacity, Slots: 16}})
	if err != nil {
		t.Fatal(err)
	}
	l.Close() // the file stays; the parent only watches it
	var ps []*proc
	for i := range n {
		p := spawn(t, scenario, pathEnv+"="+path, seedEnv+"="+strconv.Itoa(i))
		p.expect(t, "joined")
		ps = append(ps, p)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var samples int
	var merr error
	wg.Add(1)
	go func() { defer wg.Done(); samples, merr = monitor(path, stop) }()
	for _, p := range ps {
		fmt.Fprintln(p.in, "go")
	}
	kernel := map[int]uint64{}
	var sum, overs uint64
	for _, p := range ps {
		f := p.expect(t, "quiescent")
		kernel[int(atoi(t, f[0]))] = atoi(t, f[1])
		sum += atoi(t, f[1])
		overs += atoi(t, f[2])
	}
	close(stop)
	wg.Wait()
	if merr != nil {
		t.Fatalf("monitor after %d samples: %v", samples, merr)
	}
	h, slots := inspect(t, path)
	var slotSum uint64
	for _, s := range slots {
		if s.PID == 0 {
			continue
		}
		if s.Charged != kernel[s.PID] || s.Reserved != 0 || s.Pending != 0 {
			t.Errorf("%v, its kernel bytes %d", s, kernel[s.PID])
		}
		slotSum += s.Charged
	}
	if slotSum != h.Charged || h.Charged != sum || h.Reserved != 0 || h.Pending != 0 {
		t.Fatalf("slots %d, shared %+v, kernel %d", slotSum, h, sum)
	}
	if overs == 0 || sum == 0 {
		t.Fatalf("%d reservations refused, %d bytes held: the test did not contend, or admitted nothing", overs, sum)
	}
	t.Logf("%d monitor samples; %d refusals; %d bytes charged at quiescence", samples, overs, sum)
	for _, p := range ps {
		p.finish(t)
	}
	if h, s := inspect(t, path); h.Claimed != 0 || h.Charged != 0 || len(s) != 16 {
		t.Fatalf("after every child left: %+v", h)
	} else {
		for _, x := range s {
			if x.PID != 0 {
				t.Fatalf("left behind: %v", x)
			}
		}
	}
}
