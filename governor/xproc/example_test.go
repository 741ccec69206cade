package xproc_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/memgen/memgen/governor/xproc"
)

// A plan's Need against a ledger's header (Inspect reads it; CheckFit
// reads it and answers): what a launcher does at each verdict. The
// ledger holds 8 GiB, 5 GiB of it claimed.
func ExampleHeader_Fit() {
	next := map[xproc.FitVerdict]string{
		xproc.FitsNow:           "start it",
		xproc.StartsNow:         "start it: its KV cache grows into what others give back",
		xproc.FitsAfterGiveBack: "wait for the others to give back",
		xproc.NeverFits:         "do not start it",
	}
	h := xproc.Header{Capacity: 8 << 30, Claimed: 5 << 30}
	for _, n := range []xproc.Need{
		{Weights: 1 << 30, Start: 2 << 30, Full: 3 << 30},
		{Weights: 2 << 30, Start: 3 << 30, Full: 6 << 30},
		{Weights: 3 << 30, Start: 4 << 30, Full: 6 << 30},
		{Weights: 9 << 30, Start: 10 << 30, Full: 12 << 30},
	} {
		f := h.Fit(n)
		fmt.Printf("%s, %d GiB to give back: %s\n", f.Verdict, f.GiveBack>>30, next[f.Verdict])
	}
	// Output:
	// fits now, 0 GiB to give back: start it
	// starts now, 3 GiB to give back: start it: its KV cache grows into what others give back
	// fits after others give back, 1 GiB to give back: wait for the others to give back
	// never fits, 0 GiB to give back: do not start it
}

// An operator resizes a ledger while its processes run (memctl set does
// this): a change made on the revision last read applies; one made on a
// stale revision is refused.
func ExampleSetCapacity() {
	dir, err := os.MkdirTemp("", "xproc")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "ledger")
	l, err := xproc.Open(path, xproc.Options{Create: &xproc.CreateOptions{Capacity: 1 << 30}})
	if err != nil {
		panic(err)
	}
	defer l.Close()
	h, _, err := xproc.Inspect(path)
	if err != nil {
		panic(err)
	}
	for range 2 { // the second change is made on the revision the first replaced
		ch, err := xproc.SetCapacity(context.Background(), path, 2<<30, h.Revision)
		if err != nil {
			panic(err)
		}
		switch ch.Outcome {
		case xproc.Applied:
			fmt.Printf("applied: %d GiB, now revision %d\n", ch.Capacity>>30, ch.Revision)
		case xproc.Deferred:
			fmt.Printf("deferred: the claims exceed it by %d bytes\n", ch.Excess)
		case xproc.Refused:
			fmt.Println("refused:", ch.Reason)
		}
	}
	// Output:
	// applied: 2 GiB, now revision 2
	// refused: stale revision 1, the ledger is at 2
}
