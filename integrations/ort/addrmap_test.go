package ort

import (
	"math/rand/v2"
	"testing"
)

// TestAddrMap checks the address map against a Go map under random puts
// and takes (clustered addresses, so probe runs wrap and shift), with
// takes of absent addresses.
func TestAddrMap(t *testing.T) {
	var m addrMap
	ref := map[uint64]int64{}
	r := rand.New(rand.NewPCG(1, 2))
	var live []uint64
	for step := range 200000 {
		if len(live) == 0 || r.IntN(100) < 55 {
			addr := (1 + r.Uint64N(1<<14)) << 8
			if _, ok := ref[addr]; ok {
				continue
			}
			m.put(addr, held{})
			ref[addr] = int64(step)
			live = append(live, addr)
			continue
		}
		if r.IntN(10) == 0 {
			if _, ok := m.take(((1<<14)+1+r.Uint64N(99))<<8, true); ok {
				t.Fatal("took an address never put")
			}
		}
		i := r.IntN(len(live))
		addr := live[i]
		live[i] = live[len(live)-1]
		live = live[:len(live)-1]
		if _, ok := m.take(addr, true); !ok {
			t.Fatalf("step %d: %#x not found", step, addr)
		}
		if _, ok := m.take(addr, true); ok {
			t.Fatalf("step %d: %#x taken twice", step, addr)
		}
		delete(ref, addr)
		if m.len() != len(ref) {
			t.Fatalf("step %d: len %d, want %d", step, m.len(), len(ref))
		}
	}
	for _, addr := range live {
		if _, ok := m.take(addr, true); !ok {
			t.Fatalf("%#x not found at the end", addr)
		}
	}
	if m.len() != 0 {
		t.Fatalf("len %d at the end", m.len())
	}
}

// BenchmarkAddrMap is one put and one take, with 128 other addresses live
// (about what a fan-out run holds).
func BenchmarkAddrMap(b *testing.B) {
	var m addrMap
	for i := range 128 {
		m.put(uint64(i+1)<<16, held{})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		addr := uint64(i&1023+1)<<8 | 1<<40
		m.put(addr, held{})
		if _, ok := m.take(addr, true); !ok {
			b.Fatal("lost")
		}
	}
}
