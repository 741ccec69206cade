package governor_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// The ordinary allocation flow: reserve a grant, let the mechanism draw from
// it (the checked wrapper does this), commit it to a lease, and refund the
// lease when the memory is freed.
func Example() {
	g := governor.New(governor.Options{})
	defer g.Close()
	_ = g.AddAuthority("cuda:0", 8<<30)
	_ = g.Register("weights", nil, governor.HolderOptions{Priority: 10})

	ctx := context.Background()
	grant, err := g.Reserve(ctx, governor.Request{Authority: "cuda:0", Holder: "weights", Role: "layer0", Bytes: 3 << 30, Priority: 10})
	if err != nil {
		panic(err)
	}
	_ = grant.Draw(2 << 30) // what the allocation really took, after rounding
	lease, _ := grant.Commit()
	a, _ := g.Authority("cuda:0")
	fmt.Printf("charged %d GiB, free %d GiB\n", a.Charged>>30, a.Free>>30)

	_ = lease.MarkPending(2 << 30) // released, waiting for the stream's fences
	_ = lease.Refund(2 << 30)      // the memory is really freed
	a, _ = g.Authority("cuda:0")
	fmt.Printf("charged %d, pending %d, free %d GiB\n", a.Charged, a.Pending, a.Free>>30)
	// Output:
	// charged 2 GiB, free 6 GiB
	// charged 0, pending 0, free 8 GiB
}

// A cache that gives memory back when asked: the governor issues it a ticket
// when a reservation does not fit, and the refund serves the reservation.
func ExampleHolder() {
	g := governor.New(governor.Options{})
	defer g.Close()
	_ = g.AddAuthority("host", 1000)

	var cached governor.Lease
	cache := governor.HolderFunc(func(ctx context.Context, t governor.Ticket) (memapi.Bytes, error) {
		fmt.Printf("ticket: %d bytes on %s\n", t.Wanted, t.Authority)
		n := min(t.Wanted, cached.Bytes())
		return n, cached.Refund(n) // evict n bytes' worth
	})
	_ = g.Register("cache", cache, governor.HolderOptions{
		Priority:  0,
		Guarantee: map[memapi.AuthorityID]memapi.Bytes{"host": 200}, // never asked for
	})
	_ = g.Register("kv", nil, governor.HolderOptions{Priority: 5})

	gr, _ := g.Reserve(context.Background(), governor.Request{Authority: "host", Holder: "cache", Role: "blocks", Bytes: 900})
	_ = gr.Draw(900)
	cached, _ = gr.Commit()

	kv, err := g.Reserve(context.Background(), governor.Request{Authority: "host", Holder: "kv", Role: "pages", Bytes: 400, Priority: 5})
	fmt.Println(err, kv.Draw(400)) // all 400 bytes granted
	s := g.Snapshot()
	fmt.Println("cache keeps", s.Holders[0].Authorities[0].Charged, "tickets", s.Authorities[0].Tickets)
	// Output:
	// ticket: 300 bytes on host
	// <nil> <nil>
	// cache keeps 600 tickets 1
}

// When nothing can be freed in time, Reserve fails with the figures.
func ExampleOverBudgetError() {
	g := governor.New(governor.Options{})
	defer g.Close()
	_ = g.AddAuthority("host", 1000)
	_ = g.Register("a", nil, governor.HolderOptions{})
	gr, _ := g.Reserve(context.Background(), governor.Request{Authority: "host", Holder: "a", Role: "", Bytes: 800})
	defer gr.Cancel()

	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_, err := g.Reserve(ctx, governor.Request{Authority: "host", Holder: "a", Role: "", Bytes: 500})
	var ob *governor.OverBudgetError
	if errors.As(err, &ob) {
		fmt.Println(errors.Is(err, memapi.ErrOverBudget), errors.Is(err, context.DeadlineExceeded))
		fmt.Printf("wanted %d, free %d, reclaimable %d, pending %d\n", ob.Wanted, ob.Free, ob.Reclaimable, ob.Pending)
	}
	// Output:
	// true true
	// wanted 500, free 200, reclaimable 0, pending 0
}

// A grant whose deadline passes gives its undrawn bytes back.
func ExampleRequest_deadline() {
	g := governor.New(governor.Options{})
	defer g.Close()
	_ = g.AddAuthority("host", 1000)
	_ = g.Register("ws", nil, governor.HolderOptions{})
	gr, _ := g.Reserve(context.Background(), governor.Request{Authority: "host", Holder: "ws", Role: "workspace", Bytes: 600, Deadline: time.Now().Add(time.Millisecond)})
	time.Sleep(5 * time.Millisecond)
	err := gr.Draw(100)
	fmt.Println(errors.Is(err, memapi.ErrGrantClosed), errors.Is(err, context.DeadlineExceeded))
	a, _ := g.Authority("host")
	fmt.Println("free", a.Free)
	// Output:
	// true true
	// free 1000
}

// A holder that reserves often just reserves: each cycle is the full
// accounting (reserve, draw, commit, refund), and each reservation gets a
// record of its own, so a handle kept past the end of its use is refused
// and never touches a later grant.
func ExampleGovernor_Reserve_cycle() {
	g := governor.New(governor.Options{})
	defer g.Close()
	_ = g.AddAuthority("cuda:0", 1<<30)
	_ = g.Register("kv", nil, governor.HolderOptions{})

	ctx := context.Background()
	page := governor.Request{Authority: "cuda:0", Holder: "kv", Role: "pages", Bytes: 2 << 20}
	for range 3 {
		grant, err := g.Reserve(ctx, page)
		if err != nil {
			panic(err)
		}
		_ = grant.Draw(2 << 20)
		lease, _ := grant.Commit()
		// ... the page is used, then freed ...
		_ = lease.Refund(2 << 20)                                          // the lease is empty: the grant's use ended
		fmt.Println(errors.Is(lease.Refund(2<<20), memapi.ErrInvalidSize)) // more than the lease holds
	}
	open, _ := g.Reserve(ctx, page)
	other, _ := g.Reserve(ctx, page)
	fmt.Println(open != other)
	a, _ := g.Authority("cuda:0")
	fmt.Printf("granted %d, reserved %d MiB\n", a.Granted, a.Reserved>>20)
	// Output:
	// true
	// true
	// true
	// true
	// granted 5, reserved 4 MiB
}
