package xproc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cuda"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
)

const chunk = 2 << 20 // the simulated device's granularity

// devicePool is the simulated GPU's physical memory, shared by the
// processes through a file of two words (size, used): each process's
// simulated driver takes from it (cudasim.Config.Pool), so a process's
// cuMemAlloc fails with OUT_OF_MEMORY when the others hold the rest, as
// on one real GPU.
type devicePool struct{ mem []byte }

func createPool(t testing.TB, size uint64) string {
	path := ledgerPath(t) + ".device"
	b := make([]byte, 16)
	put(b, 0, size)
	writeFile(t, path, b)
	return path
}

func openPool(path string) (*devicePool, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, 16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	return &devicePool{mem: mem}, nil
}

func (p *devicePool) size() *uint64 { return (*uint64)(unsafe.Pointer(&p.mem[0])) }
func (p *devicePool) used() *uint64 { return (*uint64)(unsafe.Pointer(&p.mem[8])) }

func (p *devicePool) Take(n uint64) bool {
	for {
		u := atomic.LoadUint64(p.used())
		if n > atomic.LoadUint64(p.size())-u {
			return false
		}
		if atomic.CompareAndSwapUint64(p.used(), u, u+n) {
			return true
		}
	}
}

func (p *devicePool) Give(n uint64) { atomic.AddUint64(p.used(), -n) }
func (p *devicePool) Free() uint64  { return atomic.LoadUint64(p.size()) - atomic.LoadUint64(p.used()) }

// childCUDA races for the device's chunks: with the ledger, each
// reservation is admitted by it before cuMemAlloc; without (kvcached's
// way in #467), each process sizes its own budget from cuMemGetInfo's free
// bytes at start and admits against that snapshot. It allocates 2 MiB
// chunks until refused and reports "result chunks overbudget driverOOM".
func childCUDA() error {
	pool, err := openPool(os.Getenv(poolEnv))
	if err != nil {
		return err
	}
	sim := cudasim.New(cudasim.Config{Pool: pool, Memory: 1 << 30})
	cfg := cuda.Config{Driver: sim.Table(), Authority: "cuda:0", PoolChunks: -1, SpareChunks: -1}
	if os.Getenv(defaultPoolEnv) != "" {
		cfg.PoolChunks, cfg.SpareChunks = 0, 0 // the defaults: a pool of 4 chunks, 2 of them spares
	}
	g := governor.New(governor.Options{})
	defer g.Close()
	reserve := func(n memapi.Bytes) (governor.Grant, error) {
		return g.Reserve(contextBG, governor.Request{Authority: "cuda:0", Holder: "kv", Role: "chunk", Bytes: n})
	}
	var l *Ledger
	if os.Getenv(noLedgerEnv) == "" {
		if l, err = Open(os.Getenv(pathEnv), Options{Poll: 20 * time.Millisecond}); err != nil {
			return err
		}
		a, err := l.bind(g, "cuda:0")
		if err != nil {
			return err
		}
		reserve = func(n memapi.Bytes) (governor.Grant, error) {
			return a.Reserve(contextBG, governor.Request{Holder: "kv", Role: "chunk", Bytes: n})
		}
	} else if err := g.AddAuthority("cuda:0", memapi.Bytes(pool.Free())); err != nil {
		return err
	}
	mech, err := cuda.New(cfg)
	if err != nil {
		return err
	}
	m := checked.Wrap(mech, g.Ledger())
	if err := g.Register("kv", nil, governor.HolderOptions{}); err != nil {
		return err
	}
	fmt.Println("joined")
	waitLine()
	var hold []held
	over, oom := 0, 0
	for over+oom < 3 {
		gr, err := reserve(chunk)
		if errors.Is(err, memapi.ErrOverBudget) {
			over++
			time.Sleep(time.Millisecond) // others may free; try again, as a serving loop would
			continue
		}
		if err != nil {
			return err
		}
		al, err := m.Allocate(contextBG, memapi.AllocRequest{Size: chunk}, gr)
		if errors.Is(err, memapi.ErrOutOfMemory) {
			oom++
			_ = gr.Cancel()
			continue
		}
		if err != nil {
			return err
		}
		ls, err := gr.Commit()
		if err != nil {
			return err
		}
		hold = append(hold, held{al, ls})
	}
	fmt.Println("result", len(hold), over, oom, uint64(mech.PooledBytes()))
	waitEOF()
	for _, h := range hold {
		if err := m.Free(contextBG, h.al, h.ls); err != nil {
			return err
		}
	}
	if err := mech.Close(); err != nil {
		return err
	}
	if l != nil {
		if err := l.Close(); err != nil {
			return err
		}
	}
	fmt.Println("done")
	return nil
}

// lastChunks runs n processes on one simulated device of size bytes and
// returns the chunks they got, their over-budget refusals and the driver
// out-of-memory errors they hit.
func lastChunks(t *testing.T, n int, size uint64, ledger, defaultPool bool) (chunks, over, oom uint64) {
	pool := createPool(t, size)
	path := ledgerPath(t)
	env := []string{poolEnv + "=" + pool, pathEnv + "=" + path}
	if defaultPool {
		env = append(env, defaultPoolEnv+"=1")
	}
	if ledger {
		l, err := Open(path, Options{Create: &CreateOptions{Capacity: size, Slots: 8}})
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
	} else {
		env = append(env, noLedgerEnv+"=1")
	}
	var ps []*proc
	for i := range n {
		p := spawn(t, "cuda", append(env, seedEnv+"="+strconv.Itoa(i))...)
		p.expect(t, "joined")
		ps = append(ps, p)
	}
	for _, p := range ps {
		fmt.Fprintln(p.in, "go")
	}
	var pooled uint64
	for _, p := range ps {
		f := p.expect(t, "result")
		chunks += atoi(t, f[0])
		over += atoi(t, f[1])
		oom += atoi(t, f[2])
		pooled += atoi(t, f[3])
	}
	dp, err := openPool(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(dp.mem)
	if used := atomic.LoadUint64(dp.used()); used != chunks*chunk+pooled {
		t.Errorf("the device holds %d bytes, the processes %d chunks and %d pooled bytes", used, chunks, pooled)
	}
	if ledger {
		h, _ := inspect(t, path)
		if h.Claimed > size {
			t.Errorf("claims %d beyond the device's %d", h.Claimed, size)
		}
	}
	for _, p := range ps {
		p.finish(t)
	}
	return chunks, over, oom
}

// kvcached #467 reproduced, and closed: several processes sharing one
// device race for its last chunks. Admitting against a snapshot of the
// free memory (each process's own budget) sends the losers into the
// driver's OUT_OF_MEMORY; admitting through the shared ledger refuses them
// with ErrOverBudget first, so the driver never runs out.
func TestLastChunksRace(t *testing.T) {
	const n, size = 4, 16 * chunk
	chunks, over, oom := lastChunks(t, n, size, false, false)
	t.Logf("without the ledger: %d chunks, %d refusals, %d driver out-of-memory", chunks, over, oom)
	if oom == 0 {
		t.Fatal("without the ledger no process hit the driver's OUT_OF_MEMORY: the race between processes was not reproduced")
	}
	chunks, over, oom = lastChunks(t, n, size, true, false)
	t.Logf("with the ledger: %d chunks, %d refusals, %d driver out-of-memory", chunks, over, oom)
	if oom != 0 {
		t.Fatalf("%d driver out-of-memory errors with the shared ledger", oom)
	}
	if chunks != size/chunk || over < n {
		t.Fatalf("%d chunks of %d, %d refusals", chunks, size/chunk, over)
	}
}

// The same race with the mechanism's default pool (4 chunks of 2 MiB, 2 of
// them spares, per process) and the shared capacity equal to the device:
// the pools are counted in the processes' slots, so the driver never runs
// out (the pools used to be invisible to the ledger: 8 MiB a process the
// claims could also take).
func TestLastChunksWithDefaultPools(t *testing.T) {
	const n, size = 4, 32 * chunk
	chunks, over, oom := lastChunks(t, n, size, true, true)
	t.Logf("default pools, with the ledger: %d chunks, %d refusals, %d driver out-of-memory", chunks, over, oom)
	if oom != 0 {
		t.Fatalf("%d driver out-of-memory errors with the shared ledger and the default pools", oom)
	}
	if chunks == 0 || over < n {
		t.Fatalf("%d chunks, %d refusals", chunks, over)
	}
}
