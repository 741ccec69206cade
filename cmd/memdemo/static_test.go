package main

import (
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/stretchr/testify/require"
)

// requireFigures compares f with want: the utilisation figures within
// rounding, everything else exactly.
func requireFigures(t *testing.T, want, f Figures) {
	t.Helper()
	require.InDelta(t, want.MeanConcurrent, f.MeanConcurrent, 1e-12, "mean concurrent")
	require.InDelta(t, want.KVUtilMean, f.KVUtilMean, 1e-12, "KV utilisation, mean")
	require.InDelta(t, want.KVUtilAtPeak, f.KVUtilAtPeak, 1e-12, "KV utilisation at the peak")
	f.MeanConcurrent, f.KVUtilMean, f.KVUtilAtPeak = want.MeanConcurrent, want.KVUtilMean, want.KVUtilAtPeak
	f.busy, f.utilSum, f.utilTime = 0, 0, 0
	require.Equal(t, want, f)
}

func TestStaticOracleArithmetic(t *testing.T) {
	// One byte per token, ten bytes of KV, one second per iteration.
	w := Workload{KVBudget: 10, BytesPerToken: 1, Step: StepModel{Base: time.Second}, Reqs: []Request{
		{ID: 0, Prompt: 4, Gen: 2},  // context 6
		{ID: 1, Prompt: 3, Gen: 1},  // context 4
		{ID: 2, Prompt: 5, Gen: 1},  // context 6: waits until 0 finishes
		{ID: 3, Prompt: 20, Gen: 1}, // context 21 > 10: rejected
	}}
	f := StaticBaseline(w, ReserveOracle, 16)
	// t=0: 0 and 1 admitted (6+4 = 10 bytes reserved), each generates a
	// token: 5+4 = 9 token bytes of 10 (0.9); 1 finishes. t=1: 2 still
	// does not fit beside 0 (6+6 > 10); 0 reaches 6 of its 6 (1.0) and
	// finishes. t=2: 2 admitted, 3 rejected; 2 reaches 6 of 6 (1.0).
	// Utilisation: mean (0.9+1+1)/3, 0.9 at the peak of 10 bytes.
	requireFigures(t, Figures{
		Requests: 4, Served: 3, Rejected: 1,
		PeakConcurrent: 2, MeanConcurrent: 4.0 / 3.0, PeakKVBytes: 10,
		Tokens: 4, SimTime: 3 * time.Second, Steps: 3,
		KVUtilMean: 2.9 / 3, KVUtilAtPeak: 0.9,
	}, f)
	require.InDelta(t, 4.0/3.0, f.Throughput(), 1e-12)
}

func TestStaticMaxArithmetic(t *testing.T) {
	// A context length of 8 tokens: every request reserves 8 bytes of a
	// 16-byte budget, so two run at a time.
	w := Workload{KVBudget: 16, BytesPerToken: 1, Step: StepModel{Base: time.Second}, Reqs: []Request{
		{ID: 0, Prompt: 2, Gen: 2}, // context 4
		{ID: 1, Prompt: 3, Gen: 1}, // context 4
		{ID: 2, Prompt: 1, Gen: 1}, // context 2: waits for a slot of 8
		{ID: 3, Prompt: 8, Gen: 1}, // context 9 > 8: rejected
	}}
	f := StaticBaseline(w, ReserveMax, 8)
	// t=0: 0 and 1 reserve 8 each (16); tokens 3+4 = 7 of 16; 1
	// finishes. t=1: 2 takes its slot, 3 is rejected; tokens 4+2 = 6 of
	// 16; both finish. Utilisation: mean (7+6)/2/16 = 13/32, 7/16 at the
	// first 16-byte iteration.
	requireFigures(t, Figures{
		Requests: 4, Served: 3, Rejected: 1,
		PeakConcurrent: 2, MeanConcurrent: 2, PeakKVBytes: 16,
		Tokens: 4, SimTime: 2 * time.Second, Steps: 2,
		KVUtilMean: 13.0 / 32, KVUtilAtPeak: 7.0 / 16,
	}, f)
}

func TestStaticPow2Arithmetic(t *testing.T) {
	w := Workload{KVBudget: 16, BytesPerToken: 1, Step: StepModel{Base: time.Second}, Reqs: []Request{
		{ID: 0, Prompt: 2, Gen: 2}, // context 4: reserves 4
		{ID: 1, Prompt: 3, Gen: 2}, // context 5: reserves 8
		{ID: 2, Prompt: 1, Gen: 1}, // context 2: reserves 2
		{ID: 3, Prompt: 8, Gen: 1}, // context 9 > 8: rejected
	}}
	f := StaticBaseline(w, ReservePow2, 8)
	// t=0: 4+8+2 = 14 bytes reserved; tokens 3+4+2 = 9 of 14; 2
	// finishes (12 reserved). t=1: tokens 4+5 = 9 of 12; 0 and 1 finish.
	// Utilisation: mean (9/14 + 9/12)/2, 9/14 at the 14-byte peak.
	requireFigures(t, Figures{
		Requests: 4, Served: 3, Rejected: 1,
		PeakConcurrent: 3, MeanConcurrent: 2.5, PeakKVBytes: 14,
		Tokens: 5, SimTime: 2 * time.Second, Steps: 2,
		KVUtilMean: (9.0/14 + 9.0/12) / 2, KVUtilAtPeak: 9.0 / 14,
	}, f)
}

func TestReservationTokens(t *testing.T) {
	for _, c := range []struct {
		r          Reservation
		ctx, limit int
		want       int
		ok         bool
	}{
		{ReservePow2, 1, 16, 1, true},
		{ReservePow2, 5, 16, 8, true},
		{ReservePow2, 8, 16, 8, true},
		{ReservePow2, 9, 16, 16, true},
		{ReservePow2, 12, 12, 12, true}, // 16 capped at the context length
		{ReservePow2, 13, 12, 12, false},
		{ReserveMax, 3, 16384, 16384, true},
		{ReserveMax, 16385, 16384, 16384, false},
		{ReserveOracle, 16385, 16384, 16385, true},
	} {
		n, ok := c.r.Tokens(Request{Prompt: c.ctx - 1, Gen: 1}, c.limit)
		require.Equal(t, c.want, n, "%v of %d under %d", c.r, c.ctx, c.limit)
		require.Equal(t, c.ok, ok, "%v of %d under %d", c.r, c.ctx, c.limit)
	}
}

func TestPagedGrowthAndPreemption(t *testing.T) {
	// Blocks of 4 tokens, one byte per token, 12 bytes: 3 blocks. No
	// watermark, no prefix. One second per iteration plus 1 ms per token
	// prefilled.
	m := StepModel{Base: time.Second, PerPrefillToken: time.Millisecond}
	w := Workload{KVBudget: 12, BytesPerToken: 1, Step: m, Reqs: []Request{
		{ID: 0, Prompt: 3, Gen: 3}, // A
		{ID: 1, Prompt: 4, Gen: 2}, // B
		{ID: 2, Prompt: 2, Gen: 1}, // C
	}}
	f := PagedBaseline(w, Paging{BlockTokens: 4})
	// Step 1 (3 running, 9 prompt tokens: 1.009 s): A, B, C take a block
	// each (3 free -> 0). A grows to 4 tokens (fits), B to 5 needs a block:
	// none free, so the newest, C, is preempted (1 free) and B takes it.
	// States 4+5 = 9 in 3 blocks (12 bytes): 0.75.
	// Step 2 (2 running, 1 s): C's block is back but taken; A grows to 5
	// and needs a block: B, the newest, is preempted (2 free), A takes one
	// (1 free). States 5 in 2 blocks (8 bytes): 0.625.
	// Step 3 (1 running, 1 s): B needs 2 blocks for its 5 tokens, 1 free:
	// the head waits. A reaches 6 (fits) and finishes: 6 of 8, 0.75; 3 free.
	// Step 4 (2 running, B's 5 and C's 2 tokens recomputed: 1.007 s): B and
	// C back (2+1 blocks), B reaches 6, C 3: 9 of 12, 0.75; both finish.
	d1, d4 := time.Second+9*time.Millisecond, time.Second+7*time.Millisecond
	sim := d1 + 2*time.Second + d4
	requireFigures(t, Figures{
		Requests: 3, Served: 3,
		PeakConcurrent: 3, MeanConcurrent: (3*d1.Seconds() + 2 + 1 + 2*d4.Seconds()) / sim.Seconds(),
		PeakKVBytes: 12, Tokens: 6, SimTime: sim, Steps: 4,
		KVUtilMean:   (0.75*d1.Seconds() + 0.625 + 0.75 + 0.75*d4.Seconds()) / sim.Seconds(),
		KVUtilAtPeak: 0.75,
	}, f)
}

func TestPagedPrefixSharingAndWatermark(t *testing.T) {
	// Blocks of 4 tokens, 20 bytes: 5 blocks. A 6-token system prompt
	// shares its one full block (4 tokens); its other 2 tokens are each
	// request's own. Watermark 0.2 of 5 blocks: 1 block.
	w := Workload{KVBudget: 20, BytesPerToken: 1, Step: StepModel{Base: time.Second}, Reqs: []Request{
		{ID: 0, Prompt: 7, Gen: 1}, // shares the prefix: 3 own tokens
		{ID: 1, Prompt: 5, Gen: 2}, // shorter than the prefix: 5 own tokens
		{ID: 2, Prompt: 6, Gen: 1}, // shares the prefix: 2 own tokens
	}}
	f := PagedBaseline(w, Paging{BlockTokens: 4, PrefixTokens: 6, Watermark: 0.2})
	// 4 blocks free beside the shared one. t=0: 0 takes 1 (3 free), 1
	// takes 2 (1 free, = the watermark), 2 would leave 0 < 1: waits.
	// Step 1: 0 reaches 4 own tokens, 1 reaches 6: states 4 (prefix) + 4
	// + 6 = 14 in 1+1+2 blocks (16 bytes): 0.875; 0 finishes (2 free).
	// Step 2: 2 admitted (1 free); 1 reaches 7, 2 reaches 3: 4+7+3 = 14
	// of 16: 0.875; both finish.
	requireFigures(t, Figures{
		Requests: 3, Served: 3,
		PeakConcurrent: 2, MeanConcurrent: 2, PeakKVBytes: 16,
		Tokens: 4, SimTime: 2 * time.Second, Steps: 2,
		KVUtilMean: 0.875, KVUtilAtPeak: 0.875,
	}, f)

	// Without the watermark, 2 runs from the start.
	f = PagedBaseline(w, Paging{BlockTokens: 4, PrefixTokens: 6})
	require.Equal(t, 3, f.PeakConcurrent)
}

func TestPagedRejectsWhatNeverFits(t *testing.T) {
	// 8 bytes = 2 blocks of 4: a 9-token request needs 3.
	w := Workload{KVBudget: 8, BytesPerToken: 1, Step: StepModel{Base: time.Second}, Reqs: []Request{
		{ID: 0, Prompt: 8, Gen: 1},
		{ID: 1, Arrival: time.Second, Prompt: 4, Gen: 4}, // 8 tokens: 2 blocks
	}}
	f := PagedBaseline(w, Paging{BlockTokens: 4})
	require.Equal(t, 1, f.Rejected)
	require.Equal(t, 1, f.Served)
	require.Equal(t, int64(4), f.Tokens)
	require.Equal(t, memapi.Bytes(8), f.PeakKVBytes)
	require.Equal(t, 5*time.Second, f.SimTime, "the idle gap to the second arrival, then 4 iterations")
}

func TestStaticBaselineIdleGapsAndPrefill(t *testing.T) {
	m := StepModel{Base: 10 * time.Millisecond, PerSeq: time.Millisecond, PerPrefillToken: 100 * time.Microsecond}
	w := Workload{KVBudget: 1 << 20, BytesPerToken: 1024, Step: m, Reqs: []Request{
		{ID: 0, Arrival: 0, Prompt: 10, Gen: 2},
		{ID: 1, Arrival: 5 * time.Second, Prompt: 0, Gen: 1},
	}}
	f := StaticBaseline(w, ReserveOracle, 16384)
	// Request 0: a prefill iteration of 10+1+1 ms, then 10+1 ms; request 1
	// arrives after an idle gap and takes one 11 ms iteration.
	require.Equal(t, 5*time.Second+11*time.Millisecond, f.SimTime)
	require.Equal(t, 3, f.Steps)
	require.Equal(t, 2, f.Served)
	require.Equal(t, int64(3), f.Tokens)
	require.Equal(t, 1, f.PeakConcurrent)
	require.Equal(t, memapi.Bytes(12*1024), f.PeakKVBytes)
	require.InDelta(t, float64(12+11+11)*1e-3/f.SimTime.Seconds(), f.MeanConcurrent, 1e-12)
}

func TestStaticBaselineHoldsTheMaximumContext(t *testing.T) {
	// Three identical requests; a budget for exactly two maximum contexts.
	w := Workload{KVBudget: 400, BytesPerToken: 1, Step: StepModel{Base: time.Millisecond}, Reqs: []Request{
		{ID: 0, Prompt: 100, Gen: 100}, {ID: 1, Prompt: 100, Gen: 100}, {ID: 2, Prompt: 100, Gen: 100}}}
	f := StaticBaseline(w, ReserveOracle, 16384)
	require.Equal(t, 2, f.PeakConcurrent, "each holds 200 bytes from admission, however few tokens it has yet")
	require.Equal(t, memapi.Bytes(400), f.PeakKVBytes)
	require.Equal(t, 200, f.Steps, "the third runs after the first two")
	require.Equal(t, int64(300), f.Tokens)
}

func TestStepModel(t *testing.T) {
	m := StepModel{Base: 20 * time.Millisecond, PerSeq: 150 * time.Microsecond, PerPrefillToken: 20 * time.Microsecond}
	require.Equal(t, 20*time.Millisecond, m.Duration(0, 0))
	require.Equal(t, 20*time.Millisecond+10*150*time.Microsecond+1000*20*time.Microsecond, m.Duration(10, 1000))
}
