package main

import (
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// Figures are what the comparison of systems reads from a run: the memgen
// run and every baseline fill them the same way, one iteration at a time.
type Figures struct {
	Requests int // requests in the trace
	Served   int // requests that generated all their tokens
	Rejected int // requests whose context can never fit the budget

	PeakConcurrent int           // most requests running in one iteration
	MeanConcurrent float64       // running requests, weighted by simulated time over the makespan
	Tokens         int64         // tokens generated
	SimTime        time.Duration // simulated makespan, from the first arrival to the last finish
	Steps          int           // decode iterations

	// PeakKVBytes is the most KV memory reserved or committed at the end
	// of an iteration (the shared prefix included).
	PeakKVBytes memapi.Bytes
	// KVUtilMean is the KV utilisation, token-state bytes over KV bytes
	// reserved or committed, averaged over the iterations weighted by
	// their simulated time; KVUtilAtPeak is the utilisation at the first
	// iteration that reached PeakKVBytes. Token-state bytes are the
	// tokens' KV actually stored: every running request's tokens so far,
	// and a shared prefix once.
	KVUtilMean   float64
	KVUtilAtPeak float64

	busy     time.Duration // sum over iterations of running x duration
	utilSum  float64       // sum over iterations of utilisation x seconds
	utilTime time.Duration // the iterations' time with KV memory held
}

// Throughput returns the simulated tokens generated per second.
func (f Figures) Throughput() float64 {
	if f.SimTime <= 0 {
		return 0
	}
	return float64(f.Tokens) / f.SimTime.Seconds()
}

func (f *Figures) step(running int, d time.Duration) {
	f.Steps++
	f.PeakConcurrent = max(f.PeakConcurrent, running)
	f.busy += time.Duration(running) * d
}

// kv records the KV memory at the end of an iteration of duration d:
// tokens bytes of token state in held bytes reserved or committed.
func (f *Figures) kv(tokens, held memapi.Bytes, d time.Duration) {
	if held == 0 {
		return
	}
	u := float64(tokens) / float64(held)
	f.utilSum += u * d.Seconds()
	f.utilTime += d
	if held > f.PeakKVBytes {
		f.PeakKVBytes, f.KVUtilAtPeak = held, u
	}
}

func (f *Figures) finish(now time.Duration) {
	f.SimTime = now
	if now > 0 {
		f.MeanConcurrent = float64(f.busy) / float64(now)
	}
	if f.utilTime > 0 {
		f.KVUtilMean = f.utilSum / f.utilTime.Seconds()
	}
}
