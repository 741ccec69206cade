package xproc

import (
	"encoding/binary"
	"fmt"
	"hash/crc64"
)

// The ledger file is a header of 24 little-endian 64-bit words followed by
// one slot of 24 words per process. Every word is read and written as one
// aligned atomic store in the mapping, so a reader never sees a torn figure.
// The header carries a CRC-64 of its words and each occupied slot a sum
// of its own (slotSum), written by the lock holder as it lets go: a member
// that takes the lock checks both, so a flipped bit or a stray write
// anywhere in the file is refused (errCorrupt) rather than trusted.
const (
	magic       uint64 = 0x00434f5250584d4d // "MMXPROC\x00"
	version     uint64 = 4                  // the format this package reads and writes (4: the slot's host tier and moves)
	headerWords        = 24
	slotWords          = 24
	headerSize         = headerWords * 8
	slotSize           = slotWords * 8
	// maxSlots bounds the processes one ledger can seat.
	maxSlots = 4096
	// maxBytes bounds every figure, as the governor's ledger does.
	maxBytes uint64 = 1<<52 - 1
)

// Header words.
const (
	hMagic     = iota
	hVersion                     // Version
	hSlots                       // slot count
	hCapacity                    // the shared capacity, in bytes
	hRevision                    // the limits' revision: bumped by every applied or deferred change
	hClaimed                     // sum of the slots' claims
	hReserved                    // sum of the slots' reserved
	hCharged                     // sum of the slots' charged
	hPending                     // sum of the slots' pending
	hDirty                       // non-zero (dirtyMark of the holder's PID) while a process holds the lock to write
	hReclaims                    // slots of dead processes reclaimed
	hWant                        // the operator's want: claims beyond a lowered capacity (SetCapacity, Deferred)
	hWantSeq                     // bumped by every new want, the operator's or a slot's
	hWantLeft                    // the part of the operator's want no process has taken to answer yet
	hRepairs                     // totals recomputed after a lock holder died
	hPrivate                     // sum of the slots' private bytes
	hWantOut                     // the part of the operator's want processes are answering now
	hOpSeq                       // the round of the operator's want: bumped by every SetCapacity that posts it
	hPIDNS                       // the PID namespace of the members (the inode of /proc/self/ns/pid): liveness reads PIDs in it
	hFirstZero                   // words hFirstZero to hSum-1 are reserved for a later version: written 0
	hSum       = headerWords - 1 // CRC-64 (ECMA) of words 0 to hSum-1, written with the dirty word 0
)

// Slot words.
const (
	sPID      = iota // 0: the slot is free
	sStart           // the process's start time (clock ticks after boot): tells a reused PID apart
	sClaim           // bytes of the shared capacity this process holds: its local capacity plus its private bytes
	sReserved        // its local authority's figures, settled (authority.settle)
	sCharged
	sPending
	sSeq      // bumped by every settle
	sPrivate  // device memory the process's mechanisms keep for themselves (authority.KeepPrivate)
	sWant     // bytes this process's waiting reservations lack and the ledger cannot give
	sWantLeft // the part of the want no process has taken to answer yet
	sWantOut  // the part other processes are answering now
	sWantPri  // the priority of the reservations behind the want
	sWantSeq  // bumped by every new round of the want
	// The process's host tier (Ledger.Note): what it moved off the
	// device, for the operator to see. No total sums them, and nothing
	// is admitted or refused by them.
	sHost                      // bytes it holds on its host tier
	sAsleep                    // 0 awake, or the level (1 or 2) it sleeps at
	sSleeps                    // moves noted, per kind: sleeps,
	sWakes                     // wakes,
	sOffloads                  // offloads of a KV cache
	sRestores                  // and their restores
	sLast                      // the last move noted: its kind (tierKinds' index+1) | its level<<8; 0: none yet
	sLastBytes                 // its bytes
	sLastTime                  // when it was noted, Unix nanoseconds
	sFirstZero                 // words sFirstZero to sSum-1 are reserved for a later version: written 0
	sSum       = slotWords - 1 // slotSum of words 0 to sSum-1 of an occupied slot; 0 in a free one
)

// dirtyMark is the dirty word of a lock holder: its PID in the low half and
// the PID's complement in the high half, so that a flipped bit never reads
// as a valid mark.
func dirtyMark(pid int) uint64 { return uint64(uint32(pid)) | uint64(^uint32(pid))<<32 }

// validDirty reports whether w is 0 or a dirty mark.
func validDirty(w uint64) bool { return w == 0 || uint32(w) != 0 && uint32(w>>32) == ^uint32(w) }

// crcTable is the checksum's table.
var crcTable = crc64.MakeTable(crc64.ECMA)

// headerSum is the checksum of a header image (hSum words, the dirty word
// read as 0).
func headerSum(b []byte) uint64 {
	var h [hSum * 8]byte
	copy(h[:], b[:hSum*8])
	clear(h[hDirty*8 : hDirty*8+8])
	return crc64.Checksum(h[:], crcTable)
}

// slotSum is the checksum of slot i's words w[0] to w[sSum-1]: each step
// (xor a word, multiply by an odd constant) is a bijection of the running
// value, so a change of any one word always changes the sum, and the
// slot's index is in it, so two slots' words swapped are seen too.
func slotSum(i int, w *[slotWords]uint64) uint64 {
	h := uint64(i+1) * 0x9e3779b97f4a7c15
	for k := 0; k < sSum; k++ {
		h = (h ^ w[k]) * 0xff51afd7ed558ccd
		h ^= h >> 33
	}
	return h
}

// occupiedSum is the checksum slot i's words should carry: slotSum when
// the slot has an owner, 0 when it is free.
func occupiedSum(i int, w *[slotWords]uint64) uint64 {
	if w[sPID] == 0 {
		return 0
	}
	return slotSum(i, w)
}

// slotOK reports whether slot i's words are sealed: an occupied slot
// carries its sum, and a free one is all zeros.
func slotOK(i int, w *[slotWords]uint64) bool {
	if w[sPID] == 0 {
		return *w == [slotWords]uint64{}
	}
	return w[sSum] == slotSum(i, w)
}

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
	Private  uint64 // sum of the slots' private bytes
	Dirty    bool
	Reclaims uint64
	Repairs  uint64
	Want     uint64 // bytes wanted: the operator's want plus every slot's
	WantSeq  uint64
	Checksum uint64
	// PIDNamespace is the inode of the members' PID namespace
	// (/proc/self/ns/pid), in which their PIDs are read.
	PIDNamespace uint64
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
	Private  uint64 // device memory its mechanisms keep for themselves
	Want     uint64 // bytes its waiting reservations lack (0: no want)
	WantLeft uint64 // the part of the want no process has taken to answer
	WantOut  uint64 // the part other processes are answering
	WantPri  int64  // the priority of the reservations behind the want
	WantSeq  uint64
	// The host tier, as the process noted it (Ledger.Note): the bytes
	// it holds there, the level it sleeps at (0: awake), its moves
	// counted by kind, and the last one (Kind "": none yet; its Host is
	// the slot's Host).
	Host     uint64
	Asleep   int
	Sleeps   uint64
	Wakes    uint64
	Offloads uint64
	Restores uint64
	Last     TierEvent
}

// fileSize is the size of a ledger of n slots.
func fileSize(n int) int { return headerSize + n*slotSize }

func word(b []byte, i int) uint64 { return binary.LittleEndian.Uint64(b[i*8:]) }

// parse decodes and checks a ledger's bytes: the header, then every slot.
// It never panics: a short, foreign, other-version or inconsistent image is
// a *ledgerError whose Err is errTruncated, errForeign, errVersion or
// errCorrupt. A header not marked dirty must carry its checksum (a flipped
// bit anywhere in it is errCorrupt). A header marked dirty (its lock holder
// died while it held the lock) is checked neither against its checksum nor
// against the slots' sums: the next lock holder recomputes them.
func parse(b []byte) (Header, []Slot, error) {
	if len(b) >= 8 && word(b, hMagic) != magic {
		return Header{}, nil, &ledgerError{Err: errForeign, Detail: fmt.Sprintf("magic %#x", word(b, hMagic))}
	}
	if len(b) < headerSize {
		return Header{}, nil, &ledgerError{Err: errTruncated, Detail: fmt.Sprintf("%d bytes, shorter than the %d-byte header", len(b), headerSize)}
	}
	if m := word(b, hMagic); m != magic {
		return Header{}, nil, &ledgerError{Err: errForeign, Detail: fmt.Sprintf("magic %#x", m)}
	}
	h := Header{
		Version:      word(b, hVersion),
		Capacity:     word(b, hCapacity),
		Revision:     word(b, hRevision),
		Claimed:      word(b, hClaimed),
		Reserved:     word(b, hReserved),
		Charged:      word(b, hCharged),
		Pending:      word(b, hPending),
		Private:      word(b, hPrivate),
		Dirty:        word(b, hDirty) != 0,
		Reclaims:     word(b, hReclaims),
		Repairs:      word(b, hRepairs),
		Want:         word(b, hWant),
		WantSeq:      word(b, hWantSeq),
		Checksum:     word(b, hSum),
		PIDNamespace: word(b, hPIDNS),
	}
	if h.Version != version {
		return h, nil, &ledgerError{Err: errVersion, Detail: fmt.Sprintf("version %d, this build reads %d", h.Version, version)}
	}
	if d := word(b, hDirty); !validDirty(d) {
		return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("dirty word %#x is neither 0 nor a holder's mark", d)}
	}
	if !h.Dirty && h.Checksum != headerSum(b) {
		return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("header checksum %#x, the header sums to %#x", h.Checksum, headerSum(b))}
	}
	for i := hFirstZero; i < hSum; i++ {
		if word(b, i) != 0 {
			return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("reserved header word %d is not 0", i)}
		}
	}
	n := word(b, hSlots)
	if n == 0 || n > maxSlots {
		return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("%d slots, want 1 to %d", n, maxSlots)}
	}
	h.Slots = int(n)
	if len(b) < fileSize(h.Slots) {
		return h, nil, &ledgerError{Err: errTruncated, Detail: fmt.Sprintf("%d bytes for %d slots, want %d", len(b), n, fileSize(h.Slots))}
	}
	if len(b) > fileSize(h.Slots) {
		return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("%d bytes for %d slots, want %d", len(b), n, fileSize(h.Slots))}
	}
	for _, f := range []struct {
		name string
		v    uint64
	}{{"capacity", h.Capacity}, {"claimed", h.Claimed}, {"reserved", h.Reserved}, {"charged", h.Charged}, {"pending", h.Pending},
		{"private", h.Private}, {"want", h.Want}, {"want left", word(b, hWantLeft)}, {"want out", word(b, hWantOut)}} {
		if f.v > maxBytes {
			return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("%s %d beyond %d", f.name, f.v, maxBytes)}
		}
	}
	if !h.Dirty && word(b, hWantLeft)+word(b, hWantOut) > h.Want {
		return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("the operator's want %d, %d of it left and %d out", h.Want, word(b, hWantLeft), word(b, hWantOut))}
	}
	slots := make([]Slot, h.Slots)
	var sum [5]uint64
	for i := range slots {
		s := b[headerSize+i*slotSize:]
		sl := Slot{Index: i, Start: word(s, sStart), Claim: word(s, sClaim), Reserved: word(s, sReserved),
			Charged: word(s, sCharged), Pending: word(s, sPending), Seq: word(s, sSeq), Private: word(s, sPrivate),
			Want: word(s, sWant), WantLeft: word(s, sWantLeft), WantOut: word(s, sWantOut), WantPri: int64(word(s, sWantPri)), WantSeq: word(s, sWantSeq)}
		pid := word(s, sPID)
		if pid > 1<<22 { // PID_MAX_LIMIT
			return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("slot %d: pid %d", i, pid)}
		}
		sl.PID = int(pid)
		if !h.Dirty {
			var w [slotWords]uint64
			for k := range w {
				w[k] = word(s, k)
			}
			if !slotOK(i, &w) {
				return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("slot %d: checksum %#x, its words sum to %#x (a free slot is all zeros): a bit flipped, or a non-member wrote it", i, w[sSum], occupiedSum(i, &w))}
			}
		}
		for w := sFirstZero; w < sSum; w++ {
			if word(s, w) != 0 {
				return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("slot %d: its reserved word %d is not 0", i, w)}
			}
		}
		sl.Host, sl.Sleeps, sl.Wakes, sl.Offloads, sl.Restores = word(s, sHost), word(s, sSleeps), word(s, sWakes), word(s, sOffloads), word(s, sRestores)
		asleep := word(s, sAsleep)
		if asleep > 2 {
			return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("slot %d: sleep level %d", i, asleep)}
		}
		sl.Asleep = int(asleep)
		last, ok := lastMove(word(s, sLast), word(s, sLastBytes), word(s, sLastTime))
		if !ok {
			return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("slot %d: its last move (%#x, %d bytes) is none a process notes", i, word(s, sLast), word(s, sLastBytes))}
		}
		sl.Last, sl.Last.Host = last, sl.Host
		for _, v := range []uint64{sl.Claim, sl.Reserved, sl.Charged, sl.Pending, sl.Private, sl.Want, sl.WantLeft, sl.WantOut, sl.Host} {
			if v > maxBytes {
				return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("slot %d: a figure beyond %d", i, maxBytes)}
			}
		}
		if !h.Dirty {
			if sl.PID == 0 && (sl.Claim|sl.Reserved|sl.Charged|sl.Pending|sl.Private|sl.Want|sl.WantLeft|sl.WantOut|sl.Host) != 0 {
				return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("slot %d: free but holds bytes", i)}
			}
			if u := sl.Reserved + sl.Charged + sl.Pending + sl.Private; u > sl.Claim {
				return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("slot %d: uses %d beyond its claim %d", i, u, sl.Claim)}
			}
			if sl.WantLeft+sl.WantOut > sl.Want {
				return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("slot %d: want %d, %d of it left and %d out", i, sl.Want, sl.WantLeft, sl.WantOut)}
			}
		}
		sum[0] += sl.Claim
		sum[1] += sl.Reserved
		sum[2] += sl.Charged
		sum[3] += sl.Pending
		sum[4] += sl.Private
		h.Want += sl.Want
		slots[i] = sl
	}
	if !h.Dirty && (sum != [5]uint64{h.Claimed, h.Reserved, h.Charged, h.Pending, h.Private}) {
		return h, nil, &ledgerError{Err: errCorrupt, Detail: fmt.Sprintf("totals %d/%d/%d/%d/%d (claimed/reserved/charged/pending/private) are not the slots' sums %v",
			h.Claimed, h.Reserved, h.Charged, h.Pending, h.Private, sum)}
	}
	return h, slots, nil
}
