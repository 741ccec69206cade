package cuda

import (
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
)

// TestRealDriverLedger runs on a GPU only (MEMGEN_CUDA=real): it reports the
// device and compares the device's own free-memory figure with UsedBytes and
// PooledBytes around a commit. Other processes may move the device figure, so
// the comparison is logged for scripts/gpu-check.sh, not asserted.
func TestRealDriverLedger(t *testing.T) {
	if !realDriver() {
		t.Skip("set MEMGEN_CUDA=real on a GPU machine")
	}
	m, _ := newMech(t, cudasim.Config{}, Config{})
	info := m.Info()
	t.Logf("device %d: granularity %d, allocation granularity %d, VMM %v, pool %d bytes",
		info.Device.Ordinal, info.Granularity, info.AllocGranularity, m.offers(memapi.CapVirtualBacking), m.PooledBytes())
	if !m.offers(memapi.CapVirtualBacking) {
		return
	}
	g := info.Granularity
	free0, total, err := m.MemInfo(bg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 16 * g})
	if err != nil {
		t.Fatal(err)
	}
	defer m.ReleaseReservation(bg, res, grantFor(m))
	if err := m.Commit(bg, res, memapi.Range{Len: 16 * g}, grantFor(m)); err != nil {
		t.Fatal(err)
	}
	free1, _, err := m.MemInfo(bg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ledger: device total %d MiB; commit of %d MiB moved device free memory by %d MiB; UsedBytes %d MiB, PooledBytes %d MiB",
		total>>20, (16*g)>>20, (int64(free0)-int64(free1))>>20, m.UsedBytes()>>20, m.PooledBytes()>>20)
}
