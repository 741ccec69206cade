package main

import (
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/stretchr/testify/require"
)

func TestStaticBaselineArithmetic(t *testing.T) {
	// One byte per token, ten bytes of KV, one second per iteration.
	m := StepModel{Base: time.Second}
	reqs := []Request{
		{ID: 0, Prompt: 4, Gen: 2},  // context 6
		{ID: 1, Prompt: 3, Gen: 1},  // context 4
		{ID: 2, Prompt: 5, Gen: 1},  // context 6: waits until 0 finishes
		{ID: 3, Prompt: 20, Gen: 1}, // context 21 > 10: rejected
	}
	f := StaticBaseline(reqs, 10, 1, m)
	// t=0: 0 and 1 admitted (10 bytes), 1 finishes. t=1: 2 still does not
	// fit beside 0 (6+6 > 10); 0 finishes. t=2: 2 admitted, 3 rejected, 2
	// finishes. t=3: done.
	require.Equal(t, Figures{
		Requests: 4, Served: 3, Rejected: 1,
		PeakConcurrent: 2, MeanConcurrent: 4.0 / 3.0, PeakKVBytes: 10,
		Tokens: 4, SimTime: 3 * time.Second, Steps: 3, busy: 4 * time.Second,
	}, f)
	require.InDelta(t, 4.0/3.0, f.Throughput(), 1e-12)
}

func TestStaticBaselineIdleGapsAndPrefill(t *testing.T) {
	m := StepModel{Base: 10 * time.Millisecond, PerSeq: time.Millisecond, PerPrefillToken: 100 * time.Microsecond}
	reqs := []Request{
		{ID: 0, Arrival: 0, Prompt: 10, Gen: 2},
		{ID: 1, Arrival: 5 * time.Second, Prompt: 0, Gen: 1},
	}
	f := StaticBaseline(reqs, 1<<20, 1024, m)
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
	reqs := []Request{{ID: 0, Prompt: 100, Gen: 100}, {ID: 1, Prompt: 100, Gen: 100}, {ID: 2, Prompt: 100, Gen: 100}}
	f := StaticBaseline(reqs, 400, 1, StepModel{Base: time.Millisecond})
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
