// Package privacct puts the device memory a mechanism keeps for itself,
// outside any reservation (the CUDA mechanism's pool of physical handles
// and its spare chunks), in the account of the authority it is on when
// that authority is shared with other processes (a cross-process ledger),
// whichever of the two starts first. Without it, each process's pool is
// invisible to the others, and their claims together with the pools
// oversubscribe the device.
//
// A mechanism records what it keeps with Keep and gives it back with
// Kept.Release; a shared authority opens its account with Open. When an
// account is open on the authority, Keep keeps the bytes in it at once;
// when the mechanism came first, Open keeps them. Either way a refusal (no
// room in the shared ledger) is the caller's error and changes nothing.
// Keys are authority IDs, within this process.
package privacct

import (
	"errors"
	"fmt"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
)

// Account keeps bytes a mechanism holds for itself on a shared authority
// (the authority an xproc.Ledger binds: its KeepPrivate and ReleasePrivate).
type Account interface {
	KeepPrivate(bytes memapi.Bytes) error
	ReleasePrivate(bytes memapi.Bytes) error
}

// ErrAmbiguous refuses to keep bytes on an authority that two accounts of
// this process share (two ledgers bound under one authority ID): which of
// them the memory belongs to is the caller's to say (cuda.Config.Private).
var ErrAmbiguous = errors.New("privacct: two shared accounts in this process have the authority's ID")

// Kept is what one mechanism keeps on an authority.
type Kept struct {
	id    memapi.AuthorityID
	bytes memapi.Bytes
	acct  Account // the account holding the bytes, or nil while none is open
}

var (
	mu       sync.Mutex
	accounts = map[memapi.AuthorityID][]Account{}
	kept     = map[memapi.AuthorityID]map[*Kept]struct{}{}
)

// Keep records bytes a mechanism keeps on authority id. When one account
// is open on id, the bytes are kept in it first, and its refusal is
// returned (nothing recorded); with two, it fails with ErrAmbiguous.
func Keep(id memapi.AuthorityID, bytes memapi.Bytes) (*Kept, error) {
	mu.Lock()
	defer mu.Unlock()
	k := &Kept{id: id, bytes: bytes}
	switch as := accounts[id]; len(as) {
	case 0:
	case 1:
		if err := as[0].KeepPrivate(bytes); err != nil {
			return nil, err
		}
		k.acct = as[0]
	default:
		return nil, fmt.Errorf("%w: authority %s", ErrAmbiguous, id)
	}
	if kept[id] == nil {
		kept[id] = map[*Kept]struct{}{}
	}
	kept[id][k] = struct{}{}
	return k, nil
}

// Release gives the bytes back: to the account that holds them, whose
// error it returns. A second Release does nothing.
func (k *Kept) Release() error {
	mu.Lock()
	defer mu.Unlock()
	if _, ok := kept[k.id][k]; !ok {
		return nil
	}
	delete(kept[k.id], k)
	if k.acct != nil {
		return k.acct.ReleasePrivate(k.bytes)
	}
	return nil
}

// Open opens acct as the shared account of authority id: the bytes the
// mechanisms of this process already keep on id, outside any account,
// are kept in it now. When acct refuses any of them, those it kept go back
// and Open fails with its error, changing nothing. The returned close
// ends the account (the bytes it holds stay in it until their Release).
func Open(id memapi.AuthorityID, acct Account) (close func(), err error) {
	mu.Lock()
	defer mu.Unlock()
	var adopted []*Kept
	if len(accounts[id]) == 0 {
		for k := range kept[id] {
			if k.acct != nil {
				continue
			}
			if err := acct.KeepPrivate(k.bytes); err != nil {
				for _, a := range adopted {
					_ = acct.ReleasePrivate(a.bytes)
					a.acct = nil
				}
				return nil, err
			}
			k.acct = acct
			adopted = append(adopted, k)
		}
	}
	accounts[id] = append(accounts[id], acct)
	return func() {
		mu.Lock()
		defer mu.Unlock()
		as := accounts[id]
		for i, a := range as {
			if a == acct {
				accounts[id] = append(as[:i:i], as[i+1:]...)
				break
			}
		}
		if len(accounts[id]) == 0 {
			delete(accounts, id)
		}
	}, nil
}
