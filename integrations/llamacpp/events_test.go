package llamacpp

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/memreport"
)

// The memory report of a model that offloads a context's KV cache under
// pressure, restores it, sleeps and wakes (Options.OnMemoryEvent into
// ReportMemoryEvents): the device's timeline has each move as an event
// with its holder, its bytes and in its detail the time it took, and the
// trace a span of each; the host tier is an authority of its own, so its
// timeline has the holder of the host copies, its peak the bytes a sleep
// moved there.
func TestMemoryEventsInReport(t *testing.T) {
	rec := memreport.New(memreport.Options{Title: "a model's moves"})
	const capacity = 128 << 20
	r := newRigWith(t, capacity, cpu.Granularity4KiB, governor.Options{OnEvent: rec.Event})
	tier := r.hostTier(t)
	opts := r.options()
	opts.OnMemoryEvent = ReportMemoryEvents(rec)
	m := loadModel(t, opts)
	c, err := m.NewContext(bg(t), ContextOptions{NCtx: 512, OffloadTo: tier.bind})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(bg(t))
	sample := func() {
		r.settle(t)
		rec.Sample(r.g.Snapshot())
	}
	next, err := c.Decode(bg(t), prompt(3, 40, m.NVocab()))
	if err != nil {
		t.Fatal(err)
	}
	sample()
	kv := c.KV().Committed
	weights := r.charged(m.Holder())

	// Another holder's reservation beyond the free bytes: the context's
	// KV cache moves to the host tier.
	other := r.other(t)
	dev, _ := r.g.Authority(hostAuth)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	b, err := other.Allocate(ctx, (capacity-dev.Charged+kv/2)&^(4<<10-1)+4<<10)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	sample()
	if st := c.Stats(); st.Offloads != 1 {
		t.Fatalf("the context's stats %+v: want its KV cache offloaded once", st)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	sample()
	if _, err := c.Decode(bg(t), []int32{next}); err != nil { // restores it first
		t.Fatal(err)
	}
	sample()
	kv = c.KV().Committed
	if err := m.Sleep(bg(t), tier.bind); err != nil {
		t.Fatal(err)
	}
	sample()
	if err := m.Wake(bg(t)); err != nil {
		t.Fatal(err)
	}
	sample()
	rec.End(r.g.Snapshot())

	// The JSON the recorder writes, read back.
	var buf bytes.Buffer
	if err := rec.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var rep memreport.Report
	if err := json.Unmarshal(buf.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		kind   string
		holder governor.HolderID
		bytes  memapi.Bytes
	}{
		{"offload", c.holder, 0}, {"restore", c.holder, 0},
		{"sleep", m.Holder(), weights + kv}, {"wake", m.Holder(), weights + kv},
	}
	found := 0
	var details []string
	for _, a := range rep.Authorities {
		switch a.Authority {
		case hostAuth:
			for _, w := range want {
				n := 0
				for _, e := range a.Events {
					if e.Kind != w.kind {
						continue
					}
					n++
					if e.Holder != string(w.holder) || e.Bytes == 0 || w.bytes != 0 && e.Bytes != w.bytes || !strings.Contains(e.Detail, "took ") {
						t.Errorf("the %s event %+v: want holder %s, %d bytes (0: any), its time in the detail", w.kind, e, w.holder, w.bytes)
					}
					t.Logf("event %s: %s, %s, %s", e.Kind, e.Holder, memreport.FormatBytes(e.Bytes), e.Detail)
					details = append(details, e.Detail)
				}
				if n != 1 || a.EventCounts[w.kind] != 1 {
					t.Errorf("%d %s events kept, %d counted; want 1", n, w.kind, a.EventCounts[w.kind])
				}
			}
			found++
		case offloadAuth:
			// The host tier's own timeline: the holder of the host copies
			// peaked at what the sleep moved (more than the offload's).
			for _, h := range a.HolderStats {
				if h.Holder == "sleep" {
					if h.Peak != weights+kv || h.Final != 0 {
						t.Errorf("the host tier's holder %+v: want a peak of %d (the weights and KV) and nothing at the end", h, weights+kv)
					}
					t.Logf("host tier: holder %s peaked at %s", h.Holder, memreport.FormatBytes(h.Peak))
					found++
				}
			}
		}
	}
	if found != 2 {
		t.Fatalf("the report lacks the device's or the host tier's timeline (%d of 2)", found)
	}
	spans := map[string]bool{}
	for _, sp := range rep.Spans {
		if sp.Category == "memory" && sp.End > sp.Start {
			spans[strings.Fields(sp.Name)[0]] = true
		}
	}
	for _, k := range []string{"offload", "restore", "sleep", "wake"} {
		if !spans[k] {
			t.Errorf("no span of a %s in the trace (%v)", k, rep.Spans)
		}
	}
	var html bytes.Buffer
	if err := rec.WriteHTML(&html); err != nil {
		t.Fatal(err)
	}
	// Each event's row in the page's table of the device's events.
	for _, d := range details {
		if !strings.Contains(html.String(), d) {
			t.Errorf("the HTML report lacks the event whose detail is %q", d)
		}
	}
}
