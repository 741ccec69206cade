package cuda_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
)

// ledger is a stand-in grant: the bare mechanism only needs one to exist
// (the checked wrapper and the governor do the accounting).
type ledger struct{}

func (ledger) Authority() memapi.AuthorityID { return "cuda:0" }
func (ledger) Draw(memapi.Bytes) error       { return nil }
func (ledger) Undraw(memapi.Bytes) error     { return nil }
func (ledger) Refund(memapi.Bytes) error     { return nil }

// On a machine without the NVIDIA driver, New says why CUDA is unavailable.
func ExampleNew_unavailable() {
	m, err := cuda.New(cuda.Config{})
	if err != nil {
		var ue *cuda.UnavailableError
		fmt.Println(errors.Is(err, memapi.ErrUnavailable), errors.As(err, &ue))
		return
	}
	defer m.Close()
	fmt.Println(true, true) // a machine with a GPU
	// Output: true true
}

// Growing a buffer in place: reserve the address range once, commit chunks
// as the buffer grows. Here on the simulated driver.
func ExampleMechanism_Commit() {
	ctx := context.Background()
	sim := cudasim.New(cudasim.Config{})
	m, err := cuda.New(cuda.Config{Driver: sim.Table()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	g := m.Info().Granularity
	res, _ := m.Reserve(ctx, memapi.ReserveRequest{Size: 8 * g})
	for i := memapi.Bytes(0); i < 3; i++ {
		if err := m.Commit(ctx, res, memapi.Range{Off: i * g, Len: g}, ledger{}); err != nil {
			fmt.Println(err)
			return
		}
	}
	committed, _ := m.CommittedBytes(res)
	fmt.Printf("committed %d MiB of %d MiB at a fixed address\n", committed>>20, res.Size()>>20)
	_ = m.ReleaseReservation(ctx, res, ledger{})
	fmt.Println("used after release:", m.UsedBytes())
	// Output:
	// committed 6 MiB of 16 MiB at a fixed address
	// used after release: 0
}

// One physical backing shared read-only by two requests; a write needs an
// explicit copy-on-write.
func ExampleMechanism_MapView() {
	ctx := context.Background()
	sim := cudasim.New(cudasim.Config{})
	m, _ := cuda.New(cuda.Config{Driver: sim.Table()})
	defer m.Close()
	dc, _ := m.NewContext()
	defer dc.Close()
	s, _ := dc.NewStream()
	defer s.Close()

	g := m.Info().Granularity
	prefix, _ := m.CreateBacking(ctx, g, ledger{})
	a, _ := m.Reserve(ctx, memapi.ReserveRequest{Size: g})
	b, _ := m.Reserve(ctx, memapi.ReserveRequest{Size: g})
	va, _ := m.MapView(ctx, a, memapi.Range{Len: g}, prefix, memapi.AccessReadOnly)
	vb, _ := m.MapView(ctx, b, memapi.Range{Len: g}, prefix, memapi.AccessReadOnly)

	_ = s.CopyToDevice(b.Addr(), []byte("mine"))
	fmt.Println("write to shared view:", errors.Is(s.Synchronize(ctx), memapi.ErrReadOnly))
	own, _ := m.CopyOnWrite(ctx, vb, ledger{})
	_ = s.CopyToDevice(b.Addr(), []byte("mine"))
	fmt.Println("after copy-on-write:", s.Synchronize(ctx))
	n, _ := m.ViewCount(prefix)
	fmt.Println("views of the shared prefix:", n)

	_ = m.UnmapView(ctx, va)
	_ = m.UnmapView(ctx, own)
	_ = m.ReleaseBacking(ctx, prefix, ledger{})
	_ = m.ReleaseBacking(ctx, own.Backing(), ledger{})
	_ = m.ReleaseReservation(ctx, a, ledger{})
	_ = m.ReleaseReservation(ctx, b, ledger{})
	// Output:
	// write to shared view: true
	// after copy-on-write: <nil>
	// views of the shared prefix: 1
}
