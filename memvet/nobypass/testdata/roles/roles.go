// Package roles implements the ledger's roles outside the ledger packages.
package roles

import (
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
)

type grant struct{} // want `grant implements memapi.Grant outside the ledger packages \(governor, fakes\)`

func (grant) Authority() memapi.AuthorityID { return "" }
func (grant) Draw(memapi.Bytes) error       { return nil }
func (grant) Undraw(memapi.Bytes) error     { return nil }

type account struct{} // want `account implements memapi.Account outside the ledger packages`

func (*account) Authority() memapi.AuthorityID { return "" }
func (*account) Refund(memapi.Bytes) error     { return nil }

// An embedded ledger grant with nothing overridden issues nothing new.
type labelled struct {
	*fakes.Grant
	label string
}

// An override is an implementation.
type skimming struct { // want `skimming implements memapi.Grant`
	*fakes.Grant
}

func (s skimming) Draw(n memapi.Bytes) error { return s.Grant.Draw(n / 2) }

// Interfaces describe roles; they implement nothing.
type Ledgered interface {
	memapi.Grant
	Commit() error
}

//memvet:allow a sink that fails on any refund, for releases that must have nothing left
type zero struct{}

func (zero) Authority() memapi.AuthorityID { return "" }
func (zero) Refund(memapi.Bytes) error     { return nil }
