package xproc

import (
	"encoding/binary"
	"fmt"
)

// The ledger file is a header of 16 little-endian 64-bit words followed by
// one slot of 8 words per process. Every word is read and written as one
// aligned atomic store in the mapping, so a reader never sees a torn figure.
const (
	magic       uint64 = 0x00434f5250584d4d // "MMXPROC\x00"
	Version     uint64 = 1                  // the format this package reads and writes
	headerWords        = 16
	slotWords          = 8
	headerSize         = headerWords * 8
	slotSize           = slotWords * 8
	// MaxSlots bounds the processes one ledger can seat.
	MaxSlots = 4096
	// maxBytes bounds every figure, as the governor's ledger does.
	maxBytes uint64 = 1<<52 - 1
)

// Header words.
const (
	hMagic    = iota
	hVersion  // Version
	hSlots    // slot count
	hCapacity // the shared capacity, in bytes
	hRevision // the limits' revision: bumped by every applied or deferred change
	hClaimed  // sum of the slots' claims
	hReserved // sum of the slots' reserved
	hCharged  // sum of the slots' charged
	hPending  // sum of the slots' pending
	hDirty    // non-zero while a writer updates several words (see Ledger.lock)
	hReclaims // slots of dead processes reclaimed
	hWant     // bytes a process could not claim (cross-process pressure)
	hWantSeq  // bumped by every new want
	hWantPri  // the priority of that reservation
	hRepairs  // totals recomputed after a writer died mid-update
)

// Slot words.
const (
	sPID      = iota // 0: the slot is free
	sStart           // the process's start time (clock ticks after boot): tells a reused PID apart
	sClaim           // bytes of the shared capacity this process holds: its local authority's capacity
	sReserved        // its local authority's figures, settled (Authority.Settle)
	sCharged
	sPending
	sSeq    // bumped by every settle
	sUnused // reserved for a later version (which would bump Version); written 0
)

// Header is the decoded header of a ledger file.
type Header struct {
	Version  uint64
	Slots    int
	Capacity uint64
	Revision uint64
	Claimed  uint64
	Reserved uint64
	Charged  uint64
	Pending  uint64
	Dirty    bool
	Reclaims uint64
	Repairs  uint64
	Want     uint64
	WantSeq  uint64
}

// Slot is the decoded figures of one process.
type Slot struct {
	Index    int
	PID      int
	Start    uint64
	Claim    uint64
	Reserved uint64
	Charged  uint64
	Pending  uint64
	Seq      uint64
}

// fileSize is the size of a ledger of n slots.
func fileSize(n int) int { return headerSize + n*slotSize }

func word(b []byte, i int) uint64 { return binary.LittleEndian.Uint64(b[i*8:]) }

// Parse decodes and checks a ledger's bytes: the header, then every slot.
// It never panics: a short, foreign, other-version or inconsistent image is
// a *LedgerError whose Err is ErrTruncated, ErrForeign, ErrVersion or
// ErrCorrupt. A header marked dirty (a writer died in the middle of an
// update) is not checked against the slots' sums: the next lock holder
// recomputes them.
func Parse(b []byte) (Header, []Slot, error) {
	if len(b) < headerSize {
		return Header{}, nil, &LedgerError{Err: ErrTruncated, Detail: fmt.Sprintf("%d bytes, shorter than the %d-byte header", len(b), headerSize)}
	}
	if m := word(b, hMagic); m != magic {
		return Header{}, nil, &LedgerError{Err: ErrForeign, Detail: fmt.Sprintf("magic %#x", m)}
	}
	h := Header{
		Version:  word(b, hVersion),
		Capacity: word(b, hCapacity),
		Revision: word(b, hRevision),
		Claimed:  word(b, hClaimed),
		Reserved: word(b, hReserved),
		Charged:  word(b, hCharged),
		Pending:  word(b, hPending),
		Dirty:    word(b, hDirty) != 0,
		Reclaims: word(b, hReclaims),
		Repairs:  word(b, hRepairs),
		Want:     word(b, hWant),
		WantSeq:  word(b, hWantSeq),
	}
	if h.Version != Version {
		return h, nil, &LedgerError{Err: ErrVersion, Detail: fmt.Sprintf("version %d, this build reads %d", h.Version, Version)}
	}
	n := word(b, hSlots)
	if n == 0 || n > MaxSlots {
		return h, nil, &LedgerError{Err: ErrCorrupt, Detail: fmt.Sprintf("%d slots, want 1 to %d", n, MaxSlots)}
	}
	h.Slots = int(n)
	if len(b) < fileSize(h.Slots) {
		return h, nil, &LedgerError{Err: ErrTruncated, Detail: fmt.Sprintf("%d bytes for %d slots, want %d", len(b), n, fileSize(h.Slots))}
	}
	if len(b) > fileSize(h.Slots) {
		return h, nil, &LedgerError{Err: ErrCorrupt, Detail: fmt.Sprintf("%d bytes for %d slots, want %d", len(b), n, fileSize(h.Slots))}
	}
	for _, f := range []struct {
		name string
		v    uint64
	}{{"capacity", h.Capacity}, {"claimed", h.Claimed}, {"reserved", h.Reserved}, {"charged", h.Charged}, {"pending", h.Pending}, {"want", h.Want}} {
		if f.v > maxBytes {
			return h, nil, &LedgerError{Err: ErrCorrupt, Detail: fmt.Sprintf("%s %d beyond %d", f.name, f.v, maxBytes)}
		}
	}
	slots := make([]Slot, h.Slots)
	var sum [4]uint64
	for i := range slots {
		s := b[headerSize+i*slotSize:]
		sl := Slot{Index: i, Start: word(s, sStart), Claim: word(s, sClaim), Reserved: word(s, sReserved),
			Charged: word(s, sCharged), Pending: word(s, sPending), Seq: word(s, sSeq)}
		pid := word(s, sPID)
		if pid > 1<<22 { // PID_MAX_LIMIT
			return h, nil, &LedgerError{Err: ErrCorrupt, Detail: fmt.Sprintf("slot %d: pid %d", i, pid)}
		}
		sl.PID = int(pid)
		if word(s, sUnused) != 0 {
			return h, nil, &LedgerError{Err: ErrCorrupt, Detail: fmt.Sprintf("slot %d: its reserved word is not 0", i)}
		}
		if sl.Claim > maxBytes || sl.Reserved > maxBytes || sl.Charged > maxBytes || sl.Pending > maxBytes {
			return h, nil, &LedgerError{Err: ErrCorrupt, Detail: fmt.Sprintf("slot %d: a figure beyond %d", i, maxBytes)}
		}
		if !h.Dirty {
			if sl.PID == 0 && (sl.Claim|sl.Reserved|sl.Charged|sl.Pending) != 0 {
				return h, nil, &LedgerError{Err: ErrCorrupt, Detail: fmt.Sprintf("slot %d: free but holds bytes", i)}
			}
			if sl.Reserved+sl.Charged+sl.Pending > sl.Claim {
				return h, nil, &LedgerError{Err: ErrCorrupt, Detail: fmt.Sprintf("slot %d: uses %d beyond its claim %d", i, sl.Reserved+sl.Charged+sl.Pending, sl.Claim)}
			}
		}
		sum[0] += sl.Claim
		sum[1] += sl.Reserved
		sum[2] += sl.Charged
		sum[3] += sl.Pending
		slots[i] = sl
	}
	if !h.Dirty && (sum != [4]uint64{h.Claimed, h.Reserved, h.Charged, h.Pending}) {
		return h, nil, &LedgerError{Err: ErrCorrupt, Detail: fmt.Sprintf("totals %d/%d/%d/%d (claimed/reserved/charged/pending) are not the slots' sums %v",
			h.Claimed, h.Reserved, h.Charged, h.Pending, sum)}
	}
	return h, slots, nil
}
