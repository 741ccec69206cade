package cpu_test

import (
	"context"
	"fmt"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cpu"
)

// A region that grows in place: reserve the maximum once, commit 2 MiB
// chunks as it grows. The checked wrapper draws each commit from the grant.
func Example() {
	ctx := context.Background()
	mech, err := cpu.New(cpu.Options{Granularity: cpu.Granularity2MiB})
	if err != nil {
		panic(err)
	}
	m := checked.Wrap(mech, fakes.Ledger)
	vb, err := memapi.RequireVirtualBacking(m)
	if err != nil {
		panic(err)
	}
	grant := fakes.NewGrant(m.Info().Authority, 64<<20)

	res, err := vb.Reserve(ctx, memapi.ReserveRequest{Size: 64 << 20})
	if err != nil {
		panic(err)
	}
	for off := memapi.Bytes(0); off < 6<<20; off += 2 << 20 {
		if err := vb.Commit(ctx, res, memapi.Range{Off: off, Len: 2 << 20}, grant); err != nil {
			panic(err)
		}
	}
	committed, _ := vb.CommittedBytes(res)
	kernel, _ := mech.KernelBytes()
	fmt.Printf("committed %d MiB, drawn %d MiB, kernel %d MiB\n", committed>>20, grant.Drawn()>>20, kernel>>20)

	// Past the committed part there is no memory: a copy there fails.
	dc := mech.NewContext()
	s, _ := dc.NewStream()
	_ = s.CopyToDevice(res.Addr()+6<<20, []byte("hello"))
	fmt.Println(s.Synchronize(ctx) != nil)
	_ = s.Close()
	_ = dc.Close()

	if err := vb.ReleaseReservation(ctx, res, grant); err != nil {
		panic(err)
	}
	fmt.Printf("after release: used %d, drawn %d\n", mech.UsedBytes(), grant.Drawn())
	// Output:
	// committed 6 MiB, drawn 6 MiB, kernel 6 MiB
	// true
	// after release: used 0, drawn 0
}

// A shared prefix: one backing, read-only views for many requests, and an
// explicit, charged copy-on-write for the one that writes.
func ExampleMechanism_CopyOnWrite() {
	ctx := context.Background()
	mech, _ := cpu.New(cpu.Options{Granularity: cpu.Granularity4KiB})
	grant := fakes.NewGrant(mech.Info().Authority, 1<<20)
	dc := mech.NewContext()
	s, _ := dc.NewStream()
	defer dc.Close()
	defer s.Close()

	prefix, _ := mech.CreateBacking(ctx, 4096, grant)
	res, _ := mech.Reserve(ctx, memapi.ReserveRequest{Size: 3 * 4096})
	var views []*memapi.View
	for i := range 3 {
		access := memapi.AccessReadOnly
		if i == 0 {
			access = memapi.AccessReadWrite // the writer that fills the prefix
		}
		v, _ := mech.MapView(ctx, res, memapi.Range{Off: memapi.Bytes(i) * 4096, Len: 4096}, prefix, access)
		views = append(views, v)
	}
	_ = s.CopyToDevice(res.Addr(), []byte("shared"))
	_ = s.Synchronize(ctx)

	// Request 2 wants to write: it gets a private copy in place.
	own, _ := mech.CopyOnWrite(ctx, views[2], grant)
	_ = s.CopyToDevice(res.Addr()+2*4096, []byte("SHARED"))
	buf1, buf2 := make([]byte, 6), make([]byte, 6)
	_ = s.CopyFromDevice(buf1, res.Addr()+4096)
	_ = s.CopyFromDevice(buf2, res.Addr()+2*4096)
	_ = s.Synchronize(ctx)
	n, _ := mech.ViewCount(prefix)
	fmt.Printf("%s %s views=%d used=%d\n", buf1, buf2, n, mech.UsedBytes())

	_ = mech.UnmapView(ctx, own)
	_ = mech.ReleaseBacking(ctx, own.Backing(), grant)
	for _, v := range views[:2] {
		_ = mech.UnmapView(ctx, v)
	}
	_ = mech.ReleaseBacking(ctx, prefix, grant)
	_ = mech.ReleaseReservation(ctx, res, grant)
	fmt.Println("used", mech.UsedBytes())
	// Output:
	// shared SHARED views=2 used=8192
	// used 0
}
