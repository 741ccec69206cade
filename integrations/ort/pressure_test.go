package ort

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pool"
)

var smallModel = envOr("MEMGEN_ORT_SMALL_MODEL", cacheDir()+"/mlp4x512b256.onnx")

// mlpInput is a deterministic input for the MLPs ort.sh builds.
func mlpInput(batch, width int) tensor {
	t := tensor{Elem: elemFloat, Shape: []int64{int64(batch), int64(width)}}
	for i := range batch * width {
		t.Data = binary.LittleEndian.AppendUint32(t.Data, math.Float32bits(float32(i%97)/97-0.5))
	}
	return t
}

func needSmall(t *testing.T) {
	if _, err := os.Stat(smallModel); err != nil {
		t.Fatalf("%v: run `make ort` to build it", err)
	}
}

// isAllocFailure reports whether err is ONNX Runtime's status for an
// allocation its allocator refused.
func isAllocFailure(err error) bool {
	s := strings.ToLower(err.Error())
	return strings.Contains(s, "alloc") || strings.Contains(s, "memory")
}

// TestOverBudgetFailsCleanly: with the budget lowered below what a run
// needs, Alloc returns NULL, ONNX Runtime fails the run with its own error
// status, the allocator says why (over budget), the ledger is intact, and
// the same session runs again once the budget allows.
func TestOverBudgetFailsCleanly(t *testing.T) {
	needSmall(t)
	r := newRig(t, 1<<30, Options{Wait: -1})
	s, err := newSession(smallModel, true, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	in := []tensor{mlpInput(256, 512)}
	want, err := s.run(in)
	if err != nil {
		t.Fatal(err)
	}
	// The run's blocks are cached in the pool, and the next run would
	// reuse them: give the cache back first, so that the run must grow the
	// pool again, by a segment that the budget no longer holds.
	r.trim(t)
	held := r.audit(t, "after a run, cache trimmed")
	if err := r.g.SetCapacity(hostAuth, held+64<<10); err != nil {
		t.Fatal(err)
	}
	_, err = s.run(in)
	if err == nil {
		t.Fatal("a run over budget succeeded")
	}
	if !isAllocFailure(err) {
		t.Errorf("ONNX Runtime's status does not name the allocation: %v", err)
	}
	var over *governor.OverBudgetError
	var poolOver *pool.OverBudgetError
	if le := r.alloc.LastError(); !errors.As(le, &over) || !errors.As(le, &poolOver) || !errors.Is(le, memapi.ErrOverBudget) {
		t.Errorf("allocator's last error %v is not the pool's over-budget error over the governor's", le)
	}
	if r.alloc.Stats().Refused == 0 {
		t.Error("no Alloc was refused")
	}
	if n := r.audit(t, "after the refused run"); n != held {
		t.Errorf("charge after the refused run is %d, want %d as before it", n, held)
	}
	if err := r.g.SetCapacity(hostAuth, 1<<30); err != nil {
		t.Fatal(err)
	}
	got, err := s.run(in)
	if err != nil {
		t.Fatalf("run after the budget was raised again: %v", err)
	}
	if err := compare(got[0], want[0]); err != nil {
		t.Error(err)
	}
	s.close()
	r.auditZero(t, "session closed")
}

// TestConcurrentSessionsUnderPressure runs sessions on several goroutines
// against a budget that cannot hold all their runs at once: every run
// either succeeds with the right output or fails with ONNX Runtime's
// allocation status; at the end nothing is charged, nothing is live.
func TestConcurrentSessionsUnderPressure(t *testing.T) {
	needSmall(t)
	const workers, runs = 4, 12
	in := []tensor{mlpInput(256, 512)}

	// Calibrate: what one session holds, and what one run adds on top.
	r := newRig(t, 1<<30, Options{Wait: -1})
	s, err := newSession(smallModel, true, 1)
	if err != nil {
		t.Fatal(err)
	}
	idle := r.audit(t, "one idle session")
	r.alloc.ResetPeak()
	want, err := s.run(in)
	if err != nil {
		t.Fatal(err)
	}
	perRun := r.alloc.Stats().PeakBytes - idle
	s.close()
	r.auditZero(t, "calibration closed")
	// Room for every session and for about one and a half runs at a time.
	capacity := workers*idle + perRun*3/2
	if err := r.g.SetCapacity(hostAuth, capacity); err != nil {
		t.Fatal(err)
	}
	t.Logf("session %d bytes, run +%d bytes, capacity %d for %d workers", idle, perRun, capacity, workers)

	// Every worker opens its session first, then all run at once; a round
	// is repeated (at most 5 times) until runs both succeeded and failed,
	// since two cores may serialize a round by chance.
	var ok, refused int
	for round := 0; round < 5 && (ok == 0 || refused == 0); round++ {
		var mu sync.Mutex
		var opened, wg sync.WaitGroup
		start := make(chan struct{})
		for w := range workers {
			wg.Add(1)
			opened.Add(1)
			go func() {
				defer wg.Done()
				s, err := newSession(smallModel, true, 1)
				opened.Done()
				if err != nil {
					t.Errorf("worker %d: session: %v", w, err)
					return
				}
				defer s.close()
				<-start
				for range runs {
					got, err := s.run(in)
					mu.Lock()
					if err != nil {
						refused++
						if !isAllocFailure(err) {
							t.Errorf("worker %d: run failed with something other than an allocation failure: %v", w, err)
						}
					} else {
						ok++
						if err := compare(got[0], want[0]); err != nil {
							t.Errorf("worker %d: %v", w, err)
						}
					}
					mu.Unlock()
				}
			}()
		}
		opened.Wait()
		close(start)
		wg.Wait()
		r.auditZero(t, "round closed")
	}
	st := r.alloc.Stats()
	t.Logf("%d runs succeeded, %d failed on the budget; allocator: %d allocs, %d refused, peak %d bytes", ok, refused, st.Allocs, st.Refused, st.PeakBytes)
	if ok == 0 || refused == 0 || st.Refused == 0 {
		t.Errorf("the budget did not force pressure as intended: %d ok, %d refused", ok, refused)
	}
	if st.PeakBytes > capacity {
		t.Errorf("peak %d bytes above the capacity %d", st.PeakBytes, capacity)
	}
	snap, _ := r.g.Authority(hostAuth)
	if snap.OverBudget == 0 && snap.Cancelled == 0 {
		t.Errorf("the governor saw no refused reservation: %+v", snap)
	}
	r.auditZero(t, "all sessions closed")
}
