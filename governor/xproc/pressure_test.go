package xproc

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// childCache: a process whose holder "cache" keeps 15 allocations of 64 KiB
// on the CPU and frees them when a ticket asks; on EOF it reports the
// tickets it got, the bytes it freed and the last ticket's priority.
func childCache() error {
	c, err := joinCPU()
	if err != nil {
		return err
	}
	var mu sync.Mutex
	var hold []held
	var tickets int
	var freed memapi.Bytes
	var pri int
	cache := governor.HolderFunc(func(ctx context.Context, tk governor.Ticket) (memapi.Bytes, error) {
		mu.Lock()
		defer mu.Unlock()
		tickets++
		pri = tk.Priority
		var n memapi.Bytes
		for n < tk.Wanted && len(hold) > 0 {
			h := hold[len(hold)-1]
			if err := c.free(h); err != nil {
				return n, err
			}
			hold = hold[:len(hold)-1]
			n += h.al.Size()
		}
		freed += n
		return n, nil
	})
	if err := c.g.Register("cache", cache, governor.HolderOptions{}); err != nil {
		return err
	}
	for range 15 {
		gr, err := c.a.Reserve(contextBG, governor.Request{Holder: "cache", Role: "blocks", Bytes: 64 << 10})
		if err != nil {
			return err
		}
		al, err := c.m.Allocate(contextBG, memapi.AllocRequest{Size: 64 << 10}, gr)
		if err != nil {
			return err
		}
		ls, err := gr.Commit()
		if err != nil {
			return err
		}
		hold = append(hold, held{al, ls})
	}
	_ = c.a.Settle()
	fmt.Println("ready")
	// Until EOF, a "settle" line settles now (the dead-want trial's
	// members poll once an hour and settle when told).
	for {
		line, err := stdin.ReadString('\n')
		if err != nil {
			break
		}
		if line == "settle\n" {
			_ = c.a.Settle()
			fmt.Println("settled")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("tickets", tickets, uint64(freed), int(pri))
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

// A reservation in this process that the ledger cannot meet makes the
// holder in another process receive a ticket with its priority and free
// real memory; the reservation is then served. One that cannot wait is
// refused at once and asks nobody.
func TestPressureAcrossProcesses(t *testing.T) {
	const capacity = 1 << 20
	path := ledgerPath(t)
	_, a, _ := member(t, path, capacity, Options{Create: &CreateOptions{Capacity: capacity, Slots: 4}})
	p := spawn(t, "cache", pathEnv+"="+path)
	p.expect(t, "ready")
	if _, err := a.Reserve(context.Background(), governor.Request{Holder: "h", Role: "r", Bytes: 512 << 10, Priority: 9}); err == nil {
		t.Fatal("a reservation beyond the unclaimed bytes that cannot wait succeeded")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gr, err := a.Reserve(ctx, governor.Request{Holder: "h", Role: "r", Bytes: 512 << 10, Priority: 9})
	if err != nil {
		t.Fatalf("under pressure: %v", err)
	}
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	p.in.Close()
	f := p.expect(t, "tickets")
	if n := atoi(t, f[0]); n == 0 {
		t.Fatal("the other process got no ticket")
	}
	if freed := atoi(t, f[1]); freed < 448<<10 {
		t.Fatalf("the other process freed %d bytes, want at least the 448 KiB short", freed)
	}
	if pri, _ := strconv.Atoi(f[2]); pri != 9 {
		t.Fatalf("ticket priority %d, want the reservation's 9", pri)
	}
	p.expect(t, "done")
	if err := p.cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}
