package example

import (
	"context"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/conformancetest"
)

// zeroReserve: Reserve accepts a size of 0 and reserves a granule.
type zeroReserve struct{ *Mechanism }

func (b zeroReserve) AsVirtualBacking() (memapi.VirtualBacking, bool) { return b, true }

func (b zeroReserve) Reserve(ctx context.Context, req memapi.ReserveRequest) (*memapi.Reservation, error) {
	if req.Size == 0 {
		req.Size = 1
	}
	return b.Mechanism.Reserve(ctx, req)
}

// TestRefusedSuccessSaysOneThing: a call that must fail but succeeds is
// reported as such, once; the state it changed by succeeding is not also
// reported as the side effect of a failure ("changed state although it
// failed" contradicted "succeeded").
func TestRefusedSuccessSaysOneThing(t *testing.T) {
	res := conformancetest.Record(factory(Config{}, func(m *Mechanism) memapi.Mechanism { return zeroReserve{m} }))
	o, ok := res.Outcome("VirtualBacking/Reserve/zero-size")
	if !ok || !o.Failed {
		t.Fatalf("VirtualBacking/Reserve/zero-size = %+v, want it failed", o)
	}
	log := strings.Join(o.Log, "\n")
	if !strings.Contains(log, "Reserve with req.Size = 0: succeeded, want") {
		t.Errorf("the log does not say the call succeeded:\n%s", log)
	}
	if strings.Contains(log, "although it failed") {
		t.Errorf("the log says the call both succeeded and failed:\n%s", log)
	}
}
