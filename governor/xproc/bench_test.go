package xproc

import (
	"context"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// BenchmarkReserve is one reservation cycle (reserve, draw, commit,
// refund) on a local authority and on a shared one, in one run: x-vs-local
// is the shared cycle whose bytes stay claimed between cycles (the claim
// is given back by the watcher's settle), claim-x-vs-local the cycle that
// claims from the ledger and gives back every time (Settle after each
// refund: two file-lock round trips).
func BenchmarkReserve(b *testing.B) {
	const n = 1 << 20
	ctx := context.Background()
	cycle := func(b *testing.B, reserve func() (governor.Grant, error), after func()) time.Duration {
		start := time.Now()
		for range b.N {
			gr, err := reserve()
			if err != nil {
				b.Fatal(err)
			}
			_ = gr.Draw(n)
			ls, _ := gr.Commit()
			_ = ls.Refund(n)
			after()
		}
		return time.Since(start)
	}
	g := governor.New(governor.Options{})
	defer g.Close()
	_ = g.AddAuthority("local", 1<<30)
	_ = g.Register("h", nil, governor.HolderOptions{})
	_, a, _ := member(b, ledgerPath(b), 1<<30, Options{Poll: time.Hour})
	b.ResetTimer()
	local := cycle(b, func() (governor.Grant, error) {
		return g.Reserve(ctx, governor.Request{Authority: "local", Holder: "h", Role: "r", Bytes: n})
	}, func() {})
	reserve := func() (governor.Grant, error) {
		return a.Reserve(ctx, governor.Request{Holder: "h", Role: "r", Bytes: memapi.Bytes(n)})
	}
	kept := cycle(b, reserve, func() {})
	claimed := cycle(b, reserve, a.trimNow)
	b.StopTimer()
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	b.ReportMetric(per(local), "local-ns/op")
	b.ReportMetric(per(kept), "shared-ns/op")
	b.ReportMetric(per(claimed), "claim-ns/op")
	b.ReportMetric(per(kept)/per(local), "x-vs-local")
	b.ReportMetric(per(claimed)/per(local), "claim-x-vs-local")
}

// trimNow gives the spare claim back (Settle without the pressure answer).
func (a *authority) trimNow() {
	a.sem <- struct{}{}
	_ = a.trimLocked(context.Background(), memapi.Bytes(maxBytes), nil)
	a.unacquire()
}
