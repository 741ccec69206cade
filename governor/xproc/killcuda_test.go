package xproc

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/mechanisms/cuda"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
)

// liveDevice is a simulated GPU shared by processes that frees a process's
// memory when it dies, as the driver does with its context: a file of a
// header (size, driver out-of-memory errors seen by all) and one entry
// (pid, start time, bytes used) per process, changed under its flock; the
// bytes of a process that is gone (or a zombie) are free.
type liveDevice struct {
	f     *os.File
	mem   []byte
	entry int // this process's, or -1
}

const liveEntries = 64

const (
	cudaTrialsEnv = "MEMGEN_XPROC_CUDA_TRIALS" // kill -9 trials of TestKillNineCUDA
	churnPauseEnv = "MEMGEN_XPROC_CHURN_PAUSE" // a pause between two operations of the CUDA churn (a Go duration)
)

func createLiveDevice(t testing.TB, size uint64) string {
	path := ledgerPath(t) + ".live"
	b := make([]byte, 16+liveEntries*24)
	put(b, 0, size)
	writeFile(t, path, b)
	return path
}

func openLiveDevice(path string) (*liveDevice, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, 16+liveEntries*24, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &liveDevice{f: f, mem: mem, entry: -1}, nil
}

func (d *liveDevice) w(i int) *uint64 { return (*uint64)(unsafe.Pointer(&d.mem[i*8])) }
func (d *liveDevice) e(k, i int) *uint64 {
	return (*uint64)(unsafe.Pointer(&d.mem[16+k*24+i*8]))
}
func (d *liveDevice) lock()   { _ = syscall.Flock(int(d.f.Fd()), syscall.LOCK_EX) }
func (d *liveDevice) unlock() { _ = syscall.Flock(int(d.f.Fd()), syscall.LOCK_UN) }

// usedLocked is the bytes held by live processes; it frees the entries of
// dead ones.
func (d *liveDevice) usedLocked() uint64 {
	var u uint64
	for k := range liveEntries {
		pid := int(atomic.LoadUint64(d.e(k, 0)))
		if pid == 0 {
			continue
		}
		if k != d.entry && !alive(pid, atomic.LoadUint64(d.e(k, 1))) {
			for i := range 3 {
				atomic.StoreUint64(d.e(k, i), 0)
			}
			continue
		}
		u += atomic.LoadUint64(d.e(k, 2))
	}
	return u
}

func (d *liveDevice) Take(n uint64) bool {
	d.lock()
	defer d.unlock()
	if n > atomic.LoadUint64(d.w(0))-d.usedLocked() {
		return false
	}
	if d.entry < 0 {
		for k := range liveEntries {
			if atomic.LoadUint64(d.e(k, 0)) == 0 {
				d.entry = k
				atomic.StoreUint64(d.e(k, 1), startTime(os.Getpid()))
				atomic.StoreUint64(d.e(k, 0), uint64(os.Getpid()))
				break
			}
		}
	}
	atomic.AddUint64(d.e(d.entry, 2), n)
	return true
}

func (d *liveDevice) Give(n uint64) {
	d.lock()
	atomic.AddUint64(d.e(d.entry, 2), -n)
	d.unlock()
}

func (d *liveDevice) Free() uint64 {
	d.lock()
	defer d.unlock()
	return atomic.LoadUint64(d.w(0)) - d.usedLocked()
}

func (d *liveDevice) oom() { atomic.AddUint64(d.w(1), 1) }

// childCUDAChurn: a process on the live device with the CUDA mechanism's
// default settings (a pool of 4 chunks, 2 of them spares, kept in its
// slot), churning forever: commits and decommits 2 MiB chunks of a
// reservation, allocates and frees, settles; every driver out-of-memory
// error is counted in the device file. "ready" once it holds memory;
// "refused" when the ledger has no room for its pool.
func childCUDAChurn() error {
	go func() { waitEOF(); os.Exit(0) }() // the parent is gone: so is this churn
	dev, err := openLiveDevice(os.Getenv(poolEnv))
	if err != nil {
		return err
	}
	sim := cudasim.New(cudasim.Config{Pool: dev, Memory: 1 << 30})
	g := governor.New(governor.Options{})
	l, err := Open(os.Getenv(pathEnv), Options{Poll: 20 * time.Millisecond})
	if err != nil {
		return err
	}
	a, err := l.bind(g, "cuda:0")
	if err != nil {
		return err
	}
	if err := g.Register("kv", nil, governor.HolderOptions{}); err != nil {
		return err
	}
	mech, err := cuda.New(cuda.Config{Driver: sim.Table(), Authority: "cuda:0"}) // the default: its pool is in the ledger
	if errors.Is(err, memapi.ErrOverBudget) {
		fmt.Println("refused")
		select {}
	}
	if err != nil {
		return err
	}
	m := checked.Wrap(mech, g.Ledger())
	vb, err := memapi.RequireVirtualBacking(m)
	if err != nil {
		return err
	}
	res, err := vb.Reserve(contextBG, memapi.ReserveRequest{Size: 8 * chunk})
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed(), 4))
	committed := map[int]governor.Lease{}
	var allocs []held
	ready := false
	pause, _ := time.ParseDuration(os.Getenv(churnPauseEnv)) // 0: none
	for {
		if pause > 0 {
			time.Sleep(pause)
		}
		k := rng.IntN(10)
		switch {
		case k < 4:
			i := rng.IntN(8)
			if committed[i] != (governor.Lease{}) {
				continue
			}
			gr, err := a.Reserve(contextBG, governor.Request{Holder: "kv", Role: "chunk", Bytes: chunk})
			if err != nil {
				continue // over budget: the ledger refused before the driver
			}
			if err := vb.Commit(contextBG, res, memapi.Range{Off: memapi.Bytes(i) * chunk, Len: chunk}, gr); err != nil {
				if errors.Is(err, memapi.ErrOutOfMemory) {
					dev.oom()
				}
				_ = gr.Cancel()
				continue
			}
			ls, err := gr.Commit()
			if err != nil {
				return err
			}
			committed[i] = ls
		case k < 7:
			for i, ls := range committed {
				if err := vb.Decommit(contextBG, res, memapi.Range{Off: memapi.Bytes(i) * chunk, Len: chunk}, ls); err != nil {
					return err
				}
				delete(committed, i)
				break
			}
		case k < 8 && len(allocs) < 2:
			gr, err := a.Reserve(contextBG, governor.Request{Holder: "kv", Role: "alloc", Bytes: chunk})
			if err != nil {
				continue
			}
			al, err := m.Allocate(contextBG, memapi.AllocRequest{Size: chunk}, gr)
			if err != nil {
				if errors.Is(err, memapi.ErrOutOfMemory) {
					dev.oom()
				}
				_ = gr.Cancel()
				continue
			}
			ls, err := gr.Commit()
			if err != nil {
				return err
			}
			allocs = append(allocs, held{al, ls})
		case k < 9 && len(allocs) > 0:
			if err := m.Free(contextBG, allocs[0].al, allocs[0].ls); err != nil {
				return err
			}
			allocs = allocs[1:]
		default:
			_ = a.Settle()
		}
		if !ready && len(committed) > 0 {
			ready = true
			fmt.Println("ready")
		}
	}
}

// kill -9 trials with the CUDA mechanism's default settings on a simulated
// device the processes share (capacity = the device's memory): three
// processes churn, one is killed at a random point, its slot is reclaimed
// (the device frees its memory as it dies), another takes its place. No
// process ever gets the driver's out-of-memory error (the pools are in the
// slots), and the ledger has no drift. MEMGEN_XPROC_CUDA_TRIALS sets the
// kills (make xproc-soak: 200).
func TestKillNineCUDA(t *testing.T) {
	trials := envInt(cudaTrialsEnv, 6)
	const size = 32 * chunk
	dev := createLiveDevice(t, size)
	path := ledgerPath(t)
	l, err := Open(path, Options{Create: &CreateOptions{Capacity: size, Slots: 8}, Poll: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	next := 0
	start := func() *proc {
		next++
		p := spawn(t, "cudachurn", pathEnv+"="+path, poolEnv+"="+dev, seedEnv+"="+strconv.Itoa(next))
		t.Cleanup(func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() })
		select {
		case s := <-p.lines:
			if s == "refused" {
				t.Logf("child %d refused to start: no room for its pool", p.pid)
			} else if s != "ready" {
				t.Fatalf("child %d: %q", p.pid, s)
			}
		case <-time.After(watchdog.Bound):
			p.stacks()
			t.Fatalf("watchdog: child %d: no ready within %v; its goroutines' stacks are above (SIGQUIT)", p.pid, watchdog.Bound)
		}
		return p
	}
	var ps []*proc
	for range 3 {
		ps = append(ps, start())
	}
	kill := func(p *proc) {
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// Whichever survivor's watcher sees the death reclaims the slot.
		for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			_, s := inspect(t, path)
			if !slices.ContainsFunc(s, func(x Slot) bool { return x.PID == p.pid }) {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("child %d not reclaimed within 5 s", p.pid)
			}
		}
		_ = p.cmd.Wait()
		if _, _, err := Inspect(path); err != nil {
			t.Fatalf("after reclaiming %d: %v", p.pid, err)
		}
	}
	for i := range trials {
		time.Sleep(time.Duration(rng.IntN(200_000)) * time.Microsecond)
		k := rng.IntN(len(ps))
		kill(ps[k])
		ps[k] = start()
		_ = i
	}
	for _, p := range ps {
		kill(p)
	}
	d, err := openLiveDevice(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer d.f.Close()
	oom := atomic.LoadUint64(d.w(1))
	h, s := inspect(t, path)
	for _, x := range s {
		if x.PID != 0 && x.PID != os.Getpid() {
			t.Fatalf("slot left behind: %v", x)
		}
	}
	t.Logf("%d kills: %d driver out-of-memory errors; ledger after: %+v", trials+3, oom, h)
	if oom != 0 {
		t.Fatalf("%d driver out-of-memory errors with the default pools", oom)
	}
	if h.Claimed != 0 || h.Reserved != 0 || h.Charged != 0 || h.Pending != 0 || h.Private != 0 || h.Want != 0 || h.Dirty {
		t.Fatalf("drift after every process died: %+v", h)
	}
}
