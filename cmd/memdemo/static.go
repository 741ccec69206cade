package main

import (
	"fmt"
	"math/bits"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// Workload is what every system of the comparison replays: the same
// requests, the same KV budget and the same step model.
type Workload struct {
	Reqs          []Request
	KVBudget      memapi.Bytes // the bytes a baseline may hold for KV
	BytesPerToken memapi.Bytes
	Step          StepModel
}

// Reservation is how much a static server reserves for a request at
// admission, in tokens: the three static systems of the vLLM paper (Kwon
// et al., SOSP 2023), Orca(Max), Orca(Pow2) and Orca(Oracle).
type Reservation int

const (
	// ReserveMax reserves the served model's context length for every
	// request, whatever its length (Orca(Max)).
	ReserveMax Reservation = iota
	// ReservePow2 reserves the request's context rounded up to a power
	// of two, at most the context length: up to twice what it needs
	// (Orca(Pow2)).
	ReservePow2
	// ReserveOracle reserves exactly the request's context, prompt plus
	// generated tokens, as if the server knew the generated length
	// (Orca(Oracle)).
	ReserveOracle
)

// String returns the system's name in the summary.
func (r Reservation) String() string {
	switch r {
	case ReserveMax:
		return "static-max"
	case ReservePow2:
		return "static-pow2"
	case ReserveOracle:
		return "static-oracle"
	}
	return fmt.Sprintf("Reservation(%d)", int(r))
}

// Tokens returns the tokens reserved for q under a context length of
// maxContext, and false when the server cannot take q at all: static-max
// and static-pow2 reserve within the context length, so a longer request
// is rejected (static-oracle has no such limit).
func (r Reservation) Tokens(q Request, maxContext int) (int, bool) {
	n := q.Context()
	switch r {
	case ReserveMax:
		return maxContext, n <= maxContext
	case ReservePow2:
		p := 1 << bits.Len(uint(max(n, 1)-1)) // the smallest power of two >= n
		return min(p, maxContext), n <= maxContext
	default:
		return n, true
	}
}

// StaticBaseline replays w the way a server without on-demand KV growth
// does: each request reserves r.Tokens of KV at admission and holds it to
// the end. Admission is first come, first served, while the reservation
// fits the KV budget; every running request generates one token per
// iteration (the admitting iteration included), and iterations take the
// time the step model says. A request whose reservation alone exceeds the
// budget, or that r cannot take, is rejected.
//
// It is generous: it does not round to a granularity, and it keeps the
// whole budget less the served model's weights for KV (no second model).
// It shares nothing, so every request holds its own copy of the system
// prompt.
func StaticBaseline(w Workload, r Reservation, maxContext int) Figures {
	f := Figures{Requests: len(w.Reqs)}
	type run struct {
		left   int
		tokens int // tokens stored: prompt plus those generated so far
		bytes  memapi.Bytes
	}
	var (
		now     time.Duration
		next    int
		waiting []Request
		running []run
		used    memapi.Bytes
	)
	for next < len(w.Reqs) || len(waiting) > 0 || len(running) > 0 {
		for next < len(w.Reqs) && w.Reqs[next].Arrival <= now {
			waiting = append(waiting, w.Reqs[next])
			next++
		}
		if len(running) == 0 && len(waiting) == 0 {
			now = w.Reqs[next].Arrival
			continue
		}
		prefill := 0
		for len(waiting) > 0 {
			q := waiting[0]
			tokens, ok := r.Tokens(q, maxContext)
			need := memapi.Bytes(tokens) * w.BytesPerToken
			if !ok || need > w.KVBudget {
				f.Rejected++
				waiting = waiting[1:]
				continue
			}
			if used+need > w.KVBudget {
				break // first come, first served: the head waits
			}
			used += need
			running = append(running, run{left: q.Gen, tokens: q.Prompt, bytes: need})
			prefill += q.Prompt
			waiting = waiting[1:]
		}
		if len(running) == 0 {
			if len(waiting) > 0 {
				// The head fits the budget alone: reserved bytes were lost.
				panic(fmt.Sprintf("%v baseline: request %d waits with %d of %d bytes reserved and nothing running", r, waiting[0].ID, used, w.KVBudget))
			}
			continue // everything waiting was rejected
		}
		d := w.Step.Duration(len(running), prefill)
		f.step(len(running), d)
		now += d
		var states memapi.Bytes
		for i := range running {
			if running[i].left > 0 {
				running[i].left--
				running[i].tokens++
				f.Tokens++
			}
			states += memapi.Bytes(running[i].tokens) * w.BytesPerToken
		}
		f.kv(states, used, d)
		keep := running[:0]
		for _, q := range running {
			if q.left == 0 {
				used -= q.bytes
				f.Served++
				continue
			}
			keep = append(keep, q)
		}
		running = keep
	}
	f.finish(now)
	return f
}
