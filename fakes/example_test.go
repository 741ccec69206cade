package fakes_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
)

// A fake mechanism is real memory behind synthetic device addresses: what a
// stream copies in, it copies out.
func ExampleNewMechanism() {
	ctx := context.Background()
	m := fakes.NewMechanism(fakes.Config{Granularity: 64 << 10})
	dc := fakes.NewContext(m)
	grant := fakes.NewGrant(m.Info().Authority, 1<<20)

	res, _ := m.Reserve(ctx, memapi.ReserveRequest{Size: 1 << 20})
	_ = m.Commit(ctx, res, memapi.Range{Off: 0, Len: 64 << 10}, grant)
	n, _ := m.CommittedBytes(res)
	fmt.Println("committed:", n, "used:", m.UsedBytes())

	s, _ := dc.NewStream()
	_ = s.CopyToDevice(res.Addr(), []byte("kv"))
	out := make([]byte, 2)
	_ = s.CopyFromDevice(out, res.Addr())
	fmt.Println("read back:", string(out), s.Synchronize(ctx))

	// Beyond the committed range there is no backing.
	_ = s.CopyToDevice(res.Addr()+(64<<10), []byte("x"))
	fmt.Println(errors.Is(s.Synchronize(ctx), memapi.ErrNotCommitted))
	_ = s.Close()
	// Output:
	// committed: 65536 used: 65536
	// read back: kv <nil>
	// true
}

// Inject makes the Nth call of a method fail before it changes anything.
func ExampleMechanism_Inject() {
	ctx := context.Background()
	m := fakes.NewMechanism(fakes.Config{})
	grant := fakes.NewGrant("fake", 1<<30)
	m.Inject(fakes.Fault{Method: "Allocate", Nth: 2, Err: memapi.ErrOutOfMemory})

	_, err1 := m.Allocate(ctx, memapi.AllocRequest{Size: 100}, grant)
	_, err2 := m.Allocate(ctx, memapi.AllocRequest{Size: 100}, grant)
	fmt.Println(err1, errors.Is(err2, memapi.ErrOutOfMemory), m.AllocateCallCount(), m.UsedBytes())
	// Output: <nil> true 2 4096
}

// With manual fences the test decides when device work has run.
func ExampleContext_SetManualFences() {
	ctx := context.Background()
	m := fakes.NewMechanism(fakes.Config{})
	dc := fakes.NewContext(m)
	dc.SetManualFences(true)
	a, _ := m.Allocate(ctx, memapi.AllocRequest{Size: 8}, fakes.NewGrant("fake", 1<<20))

	s, _ := dc.NewStream()
	_ = s.CopyToDevice(a.Addr(), []byte{42})
	fence, _ := s.Record()
	b := make([]byte, 1)
	_ = m.ReadMemory(a.Addr(), b)
	fmt.Println("before:", fence.Done(), b[0])

	fence.(*fakes.Fence).Complete()
	_ = m.ReadMemory(a.Addr(), b)
	fmt.Println("after:", fence.Done(), b[0])
	_ = s.Close()
	// Output:
	// before: false 0
	// after: true 42
}

// A Recorder shared by several fakes keeps one order of their calls.
func ExampleRecorder() {
	rec := fakes.NewRecorder()
	m := fakes.NewMechanism(fakes.Config{Name: "gpu", Recorder: rec})
	grant := fakes.NewGrant("fake", 1<<20)
	grant.SetRecorder(rec)

	_ = grant.Draw(4096)
	_, _ = m.Allocate(context.Background(), memapi.AllocRequest{Size: 4096}, grant)
	fmt.Println(rec.Methods())
	// Output: [grant:fake.Draw gpu.Allocate]
}
