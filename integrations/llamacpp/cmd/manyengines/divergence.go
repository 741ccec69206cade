package main

import (
	"fmt"
	"math"
)

// top2 is one generated token's logit, the runner-up token and the
// runner-up's logit, as llamaserve answers them ("top2": true).
type top2 = [3]float64

// divergence explains where two runs' greedy tokens for one request first
// differ. Greedy decoding takes the argmax of the logits; llama.cpp's sums
// can round differently when a batch holds other sequences beside the
// request's (the shared and the static runs batch differently), so every
// logit moves a little between the runs. A choice flips when its margin
// over the runner-up is smaller than such a move. The explanation holds
// when the two runs' top two tokens are the same two, swapped, and the
// stock run's margin is at most twice the largest move seen in the
// logits of the identical tokens before (each token's logit in one run
// against the same token's in the other): rounding of the size this
// request shows elsewhere can flip it.
type divergence struct {
	request int
	engine  string
	at, of  int // the first differing token, of the memgen run's tokens
	// The choices there: the stock run's and its margin over memgen's
	// choice, memgen's and its margin over the stock's.
	stockTok, memgenTok       int32
	stockMargin, memgenMargin float64
	swapped                   bool
	// noise is the largest move of a logit over the identical tokens
	// before: |memgen's logit - stock's| of the same token.
	noise     float64
	hasLogits bool
}

// explain compares request i's tokens and top logits of the memgen run (a)
// and the stock run (b), whose tokens first differ at at.
func explain(i int, engine string, at int, a, b []int32, ta, tb []top2) divergence {
	d := divergence{request: i, engine: engine, at: at, of: len(a)}
	if at >= len(a) || at >= len(b) || at >= len(ta) || at >= len(tb) {
		return d // one run ended early (an end of generation), or no logits
	}
	d.hasLogits = true
	d.memgenTok, d.stockTok = a[at], b[at]
	sa, sb := ta[at], tb[at]
	d.swapped = int32(sa[1]) == b[at] && int32(sb[1]) == a[at]
	d.memgenMargin, d.stockMargin = sa[0]-sa[2], sb[0]-sb[2]
	for k := range at {
		d.noise = max(d.noise, math.Abs(ta[k][0]-tb[k][0]))
	}
	return d
}

// explained says whether rounding explains the divergence (see divergence).
func (d divergence) explained() bool {
	return d.hasLogits && d.swapped && d.at > 0 && d.stockMargin <= 2*d.noise
}

func (d divergence) String() string {
	s := fmt.Sprintf("request %d (%s): first differs at token %d of %d", d.request, d.engine, d.at, d.of)
	switch {
	case !d.hasLogits:
		return s + ": not explained (no logits to compare: one run ended there, or the engine answers none)"
	case !d.swapped:
		return s + fmt.Sprintf(": not explained: stock chose %d (margin %.4g), memgen %d (margin %.4g), not the same two candidates swapped",
			d.stockTok, d.stockMargin, d.memgenTok, d.memgenMargin)
	}
	why := fmt.Sprintf(": a near tie: stock chose %d over %d by %.4g, memgen %d over %d by %.4g; the logits of the %d identical tokens before moved up to %.4g between the runs",
		d.stockTok, d.memgenTok, d.stockMargin, d.memgenTok, d.stockTok, d.memgenMargin, d.at, d.noise)
	if d.explained() {
		return s + why + " (explained: batches of other shapes round llama.cpp's sums differently, and a move of that size flips this choice)"
	}
	return s + why + " (not explained: the margin is more than twice the largest move seen)"
}
