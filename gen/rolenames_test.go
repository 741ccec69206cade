package gen

import (
	"os"
	"regexp"
	"testing"
)

// TestRoleInterfacesMayBeRenamed: the grant and account roles are found
// by role, not by name, so a spec whose grant interface is Reservation
// and whose account interface is Refundable generates code that
// type-checks (the checked wrapper's Ledger took memapi.Grant and
// memapi.Account by name).
func TestRoleInterfacesMayBeRenamed(t *testing.T) {
	data, err := os.ReadFile("testdata/valid_tiny/spec.yaml")
	if err != nil {
		t.Fatal(err)
	}
	data = regexp.MustCompile(`\bGrant\b`).ReplaceAll(data, []byte("Budget"))
	data = regexp.MustCompile(`\bAccount\b`).ReplaceAll(data, []byte("Refundable"))
	s, err := Load(specName, data)
	if err != nil {
		t.Fatal(err)
	}
	if got := roleName(s, roleGrant) + "," + roleName(s, roleAccount); got != "Budget,Refundable" {
		t.Fatalf("role interfaces %s, want Budget,Refundable", got)
	}
	files, err := Generate(s, Config{Module: goldenModule})
	if err != nil {
		t.Fatal(err)
	}
	if err := typeCheck(s, goldenModule, files); err != nil {
		t.Fatal(err)
	}
}
