package plugin

import (
	"context"
	"errors"
	"testing"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pmm"
)

// TestLedger wires the reference plugin into the ProcessMemoryManager like
// any mechanism: the governor's charge equals what the plugin reports it
// holds after an allocation and a region's growth, a request over budget
// fails before the plugin is asked, and everything is refunded after the
// releases.
func TestLedger(t *testing.T) {
	ctx := context.Background()
	m, pc := newSubject(t, refhost(t))
	g := governor.New(governor.Options{})
	defer g.Close()
	if err := g.AddAuthority("host", 8<<20); err != nil {
		t.Fatal(err)
	}
	holder := governor.HolderFunc(func(context.Context, governor.Ticket) (memapi.Bytes, error) { return 0, nil })
	if err := g.Register("kv", holder, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	dc := ep.NewContext(pc, ep.Options{})
	host := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	mgr := pmm.New(g, pmm.Options{})
	if err := mgr.Register(pmm.Device{Key: host, Mechanism: m, Context: dc, Authority: "host"}); err != nil {
		t.Fatal(err)
	}
	kv, err := mgr.Bind("kv", "kv-cache", host)
	if err != nil {
		t.Fatal(err)
	}
	charged := func() memapi.Bytes {
		a, ok := g.Authority("host")
		if !ok {
			t.Fatal("no authority host")
		}
		return a.Charged
	}
	buf, err := kv.Allocate(ctx, 100<<10)
	if err != nil {
		t.Fatal(err)
	}
	region, err := kv.ReserveVirtual(ctx, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := region.Grow(ctx, 1<<20+1, func(memapi.Bytes) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if c, u := charged(), m.UsedBytes(); c != u || c == 0 {
		t.Errorf("governor charged %d, the plugin holds %d", c, u)
	}
	before := m.UsedBytes()
	if _, err := kv.Allocate(ctx, 16<<20); !errors.Is(err, memapi.ErrOverBudget) {
		t.Errorf("Allocate over budget = %v, want ErrOverBudget", err)
	}
	if got := m.UsedBytes(); got != before {
		t.Errorf("the refused allocation reached the plugin: it holds %d, was %d", got, before)
	}
	if err := buf.Close(); err != nil {
		t.Fatal(err)
	}
	if err := region.Close(); err != nil {
		t.Fatal(err)
	}
	if err := kv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dc.Close(ctx, true); err != nil {
		t.Fatal(err)
	}
	if c, u := charged(), m.UsedBytes(); c != 0 || u != 0 {
		t.Errorf("after the releases: governor charged %d, plugin holds %d; want 0 and 0", c, u)
	}
}
