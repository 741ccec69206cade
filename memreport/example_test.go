package memreport_test

import (
	"context"
	"fmt"
	"io"

	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/memreport"
)

// A program records its governor's ledger at each step of its work and
// writes the report at the end.
func Example() {
	rec := memreport.New(memreport.Options{Title: "my server"})
	g := governor.New(governor.Options{OnEvent: rec.Event}) // pressure markers
	defer g.Close()
	_ = g.AddAuthority("cuda:0", 1<<30)
	_ = g.Register("weights", nil, governor.HolderOptions{})
	rec.Label("weights", "weights")

	rec.Sample(g.Snapshot())
	// A holder's memory is charged: grant, draw (a mechanism's commit), commit.
	gr, _ := g.Reserve(context.Background(), governor.Request{Authority: "cuda:0", Holder: "weights", Role: "weights", Bytes: 256 << 20})
	_ = gr.Draw(256 << 20)
	lease, _ := gr.Commit()
	rec.Sample(g.Snapshot())
	_ = lease.Refund(256 << 20)
	rec.Sample(g.Snapshot())

	rep := rec.Report()
	tl := rep.Authorities[0]
	w, _ := tl.Holder("weights")
	fmt.Println(tl.Authority, w.Role, len(tl.Times), "samples")
	for _, b := range w.Charged {
		fmt.Println(memreport.FormatBytes(b))
	}
	if err := rec.WriteHTML(io.Discard); err != nil { // a file, in a real program
		fmt.Println(err)
	}
	// Output:
	// cuda:0 weights 3 samples
	// 0 B
	// 256 MiB
	// 0 B
}
