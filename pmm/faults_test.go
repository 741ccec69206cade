package pmm_test

import (
	"fmt"
	"strings"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// faults is the fault injector the manager's tests put on the real
// governor (governor.Options.Injector): it fails the Nth reservation,
// commit or cancel, changing nothing in the ledger, and reports every
// operation in order to onEvent ("reserve", "commit", "cancel",
// "pending", "refund", ...).
type faults struct {
	mu                      sync.Mutex
	g                       *governor.Governor
	auth                    memapi.AuthorityID
	failReserve, failCommit int              // fail the Nth call (1-based); 0 = never; failCommit < 0: every commit
	failCancel              int              // fail the Nth Cancel (1-based); 0 = never
	failRefundIf            func(n int) bool // fail the Lease.Refunds (numbered from 1) it selects
	beforeFailedRefund      func()           // runs, outside the injector's lock, before a refund it fails
	refunds                 int
	failCommitIf            func(n int) bool // fail the commits (numbered from 1) it selects
	reserves, commits       int
	cancels                 int
	onEvent                 func(string)
}

var errInjected = fmt.Errorf("injected ledger fault")

func (f *faults) MaybeError(o memapi.Op) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := o.String()
	switch op {
	case "governor.Reserve":
		f.reserves++
		if f.failReserve == f.reserves {
			return errInjected
		}
	case "governor.Grant.Commit":
		f.commits++
		if f.failCommit == f.commits || f.failCommit < 0 || (f.failCommitIf != nil && f.failCommitIf(f.commits)) {
			return errInjected
		}
	case "governor.Grant.Cancel":
		f.cancels++
		if f.failCancel == f.cancels {
			return errInjected
		}
	case "governor.Lease.Refund":
		f.refunds++
		if f.failRefundIf != nil && f.failRefundIf(f.refunds) {
			if hook := f.beforeFailedRefund; hook != nil {
				f.mu.Unlock()
				hook()
				f.mu.Lock()
			}
			return errInjected
		}
	}
	if f.onEvent != nil {
		f.onEvent(eventName(op))
	}
	return nil
}

// eventName is the name tests give op: its method's, in lower case,
// with a lease's refunds (of quarantined bytes too) "refund" and its
// MarkPending "pending".
func eventName(op string) string {
	switch op {
	case "governor.Lease.MarkPending":
		return "pending"
	case "governor.Lease.Refund", "governor.Lease.RefundQuarantined":
		return "refund"
	}
	return strings.ToLower(op[strings.LastIndexByte(op, '.')+1:])
}

// figures are the governor's figures of the tests' authority. Quarantined
// is the part of Charged whose free failed; Drawn the bytes drawn from
// open grants (part of Reserved).
type figures struct{ Reserved, Drawn, Charged, Pending, Quarantined memapi.Bytes }

func (f *faults) snapshot() figures {
	s, ok := f.g.Authority(f.auth)
	if !ok {
		panic("authority " + string(f.auth) + " missing")
	}
	return figures{Reserved: s.Reserved, Drawn: s.Drawn, Charged: s.Charged, Pending: s.Pending, Quarantined: s.Quarantined}
}

// testHolders are the holders the tests bind.
var testHolders = []string{"cold", "h", "idle", "kv", "late", "p", "prefix", "requests", "w", "weights"}

// newFaulty returns a governor with the authority a of a large capacity,
// the tests' holders registered, and faults injected by the returned
// injector.
func newFaulty(a memapi.AuthorityID) (*governor.Governor, *faults) {
	f := &faults{auth: a}
	g := governor.New(governor.Options{Injector: f})
	f.g = g
	if err := g.AddAuthority(a, 1<<40); err != nil {
		panic(err)
	}
	for _, h := range testHolders {
		if err := g.Register(governor.HolderID(h), nil, governor.HolderOptions{}); err != nil {
			panic(err)
		}
	}
	return g, f
}
