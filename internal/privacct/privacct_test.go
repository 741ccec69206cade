package privacct

import (
	"errors"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// account is a shared account with room bytes.
type account struct {
	room, kept memapi.Bytes
}

var errNoRoom = errors.New("no room")

func (a *account) KeepPrivate(n memapi.Bytes) error {
	if a.kept+n > a.room {
		return errNoRoom
	}
	a.kept += n
	return nil
}

func (a *account) ReleasePrivate(n memapi.Bytes) error {
	if n > a.kept {
		return errors.New("released more than kept")
	}
	a.kept -= n
	return nil
}

// The bytes land in the account whichever comes first, go back at
// Release (once), and a refusal changes nothing.
func TestKeptBytesFollowTheAccount(t *testing.T) {
	acct := &account{room: 100}
	k1, err := Keep("a", 30) // before the account: outside it
	if err != nil {
		t.Fatal(err)
	}
	closeAcct, err := Open("a", acct)
	if err != nil {
		t.Fatal(err)
	}
	if acct.kept != 30 {
		t.Fatalf("Open kept %d, want the 30 kept before it", acct.kept)
	}
	k2, err := Keep("a", 50) // after: in it
	if err != nil || acct.kept != 80 {
		t.Fatalf("Keep after Open: %v, kept %d", err, acct.kept)
	}
	if _, err := Keep("a", 30); !errors.Is(err, errNoRoom) || acct.kept != 80 {
		t.Fatalf("Keep beyond the room: %v, kept %d", err, acct.kept)
	}
	if _, err := Keep("b", 1000); err != nil { // another authority: no account
		t.Fatal(err)
	}
	if err := k1.Release(); err != nil || acct.kept != 50 {
		t.Fatalf("Release: %v, kept %d", err, acct.kept)
	}
	if err := k1.Release(); err != nil || acct.kept != 50 {
		t.Fatalf("second Release: %v, kept %d", err, acct.kept)
	}
	if err := k2.Release(); err != nil || acct.kept != 0 {
		t.Fatalf("Release: %v, kept %d", err, acct.kept)
	}
	closeAcct()
	if k, err := Keep("a", 1000); err != nil || acct.kept != 0 {
		t.Fatalf("Keep after the account closed: %v, kept %d", err, acct.kept)
	} else {
		_ = k.Release()
	}
}

// An Open that cannot keep every byte already kept keeps none of them.
func TestOpenWithoutRoomKeepsNothing(t *testing.T) {
	k1, _ := Keep("c", 60)
	k2, _ := Keep("c", 60)
	defer k1.Release()
	defer k2.Release()
	acct := &account{room: 100}
	if _, err := Open("c", acct); !errors.Is(err, errNoRoom) || acct.kept != 0 {
		t.Fatalf("Open without room: %v, kept %d", err, acct.kept)
	}
	big := &account{room: 200}
	closeAcct, err := Open("c", big)
	if err != nil || big.kept != 120 {
		t.Fatalf("Open with room after a refused one: %v, kept %d", err, big.kept)
	}
	defer closeAcct()
	other, err := Open("c", &account{room: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer other()
	if _, err := Keep("c", 1); !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("Keep with two accounts: %v, want ErrAmbiguous", err)
	}
}
