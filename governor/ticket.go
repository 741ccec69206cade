package governor

import (
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// Ticket is a pressure ticket: the governor's request to a holder to free
// memory on an authority. It is only a request; the holder decides what (if
// anything) it can free safely.
type Ticket struct {
	// ID is unique for the governor's life.
	ID uint64
	// Authority is the pool short of memory.
	Authority memapi.AuthorityID
	// Wanted is the bytes asked of this holder: at most its charged bytes
	// over its guarantee, minus what other tickets already ask of it.
	Wanted memapi.Bytes
	// Priority is the priority of the reservation that needs the memory.
	Priority int
	// Deadline is when that reservation stops waiting (zero: no deadline).
	Deadline time.Time
}
