//go:build memgentmpl

package memapi

import "sync/atomic"

// ChargeBook is the checked wrapper's record, kept in every handle, of the
// committed bytes it charged against the handle and has not refunded: what a
// refund of committed(h) gives back. There is one, claimed by package checked
// when it is initialized (ClaimChargeBook); its methods change nothing when
// called on any other value, so no other code can make a refund larger or
// smaller.
type ChargeBook struct {
	_ byte
}

var (
	chargeBook        = &ChargeBook{}
	chargeBookClaimed atomic.Bool
)

// ClaimChargeBook returns the ChargeBook to its first caller and nil to every
// later one.
func ClaimChargeBook() *ChargeBook {
	if !chargeBookClaimed.CompareAndSwap(false, true) {
		return nil
	}
	return chargeBook
}

// header returns h's header when b is the claimed book and h is not nil.
func (b *ChargeBook) header(h Handle) *handleHeader {
	if b != chargeBook || h == nil {
		return nil
	}
	return h.header()
}

// Add records n more bytes charged against h.
func (b *ChargeBook) Add(h Handle, n Bytes) {
	if hd := b.header(h); hd != nil && n != 0 {
		hd.charged.Add(uint64(n))
	}
}

// Sub records that n of the bytes charged against h were refunded; the figure
// never goes below zero (bytes committed past the wrapper were never charged).
func (b *ChargeBook) Sub(h Handle, n Bytes) {
	hd := b.header(h)
	if hd == nil || n == 0 {
		return
	}
	for {
		old := hd.charged.Load()
		if hd.charged.CompareAndSwap(old, old-min(old, uint64(n))) {
			return
		}
	}
}

// Charged returns the bytes charged against h and not refunded.
func (b *ChargeBook) Charged(h Handle) Bytes {
	if hd := b.header(h); hd != nil {
		return Bytes(hd.charged.Load())
	}
	return 0
}

// Clear forgets what was charged against h, once h was released and its bytes
// refunded.
func (b *ChargeBook) Clear(h Handle) {
	if hd := b.header(h); hd != nil {
		hd.charged.Store(0)
	}
}
