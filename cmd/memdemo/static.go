package main

import (
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// Figures are what the comparison with the static baseline reads from a
// run: both the memgen run and the baseline fill them the same way.
type Figures struct {
	Requests int // requests in the trace
	Served   int // requests that generated all their tokens
	Rejected int // requests whose context can never fit the budget

	PeakConcurrent int     // most requests running in one iteration
	MeanConcurrent float64 // running requests, weighted by simulated time over the makespan
	PeakKVBytes    memapi.Bytes
	Tokens         int64         // tokens generated
	SimTime        time.Duration // simulated makespan, from the first arrival to the last finish
	Steps          int           // decode iterations

	busy time.Duration // sum over iterations of running x duration
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

func (f *Figures) finish(now time.Duration) {
	f.SimTime = now
	if now > 0 {
		f.MeanConcurrent = float64(f.busy) / float64(now)
	}
}

// StaticBaseline replays reqs the way a server without on-demand KV growth
// does: each request reserves its maximum context (prompt + generated
// tokens) at admission and holds it to the end. Admission is first come,
// first served, while the reservation fits kvBudget; every running request
// generates one token per iteration (the admitting iteration included), and
// iterations take the time the step model says. A request whose context
// alone exceeds kvBudget is rejected.
//
// It is deliberately generous: the baseline knows each request's exact
// generated length (a real server reserves its maximum), does not round to
// a granularity, and keeps the whole budget less the served model's
// weights for KV (no second model).
func StaticBaseline(reqs []Request, kvBudget, bytesPerToken memapi.Bytes, m StepModel) Figures {
	f := Figures{Requests: len(reqs)}
	type run struct {
		left  int
		bytes memapi.Bytes
	}
	var (
		now     time.Duration
		next    int
		waiting []Request
		running []run
		used    memapi.Bytes
	)
	for next < len(reqs) || len(waiting) > 0 || len(running) > 0 {
		for next < len(reqs) && reqs[next].Arrival <= now {
			waiting = append(waiting, reqs[next])
			next++
		}
		if len(running) == 0 && len(waiting) == 0 {
			now = reqs[next].Arrival
			continue
		}
		prefill := 0
		for len(waiting) > 0 {
			q := waiting[0]
			need := memapi.Bytes(q.Context()) * bytesPerToken
			if need > kvBudget {
				f.Rejected++
				waiting = waiting[1:]
				continue
			}
			if used+need > kvBudget {
				break // first come, first served: the head waits
			}
			used += need
			running = append(running, run{left: q.Gen, bytes: need})
			prefill += q.Prompt
			waiting = waiting[1:]
		}
		if len(running) == 0 {
			continue // everything waiting was rejected
		}
		f.PeakKVBytes = max(f.PeakKVBytes, used)
		d := m.Duration(len(running), prefill)
		f.step(len(running), d)
		now += d
		keep := running[:0]
		for _, r := range running {
			if r.left > 0 {
				r.left--
				f.Tokens++
			}
			if r.left == 0 {
				used -= r.bytes
				f.Served++
				continue
			}
			keep = append(keep, r)
		}
		running = keep
	}
	f.finish(now)
	return f
}
