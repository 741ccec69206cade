package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDrivers builds memvet and runs it both ways the README gives, over
// the bad downstream package (a finding from every analyzer, a failing exit)
// and the corrected one (silence, exit 0).
func TestDrivers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds memvet and vets pmm's dependencies")
	}
	bin := filepath.Join(t.TempDir(), "memvet")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	const bad, good = "./memvet/testdata/downstream/bad", "./memvet/testdata/downstream/good"
	for _, c := range []struct {
		name string
		args []string
	}{
		{"vettool", []string{"go", "vet", "-vettool=" + bin}},
		{"standalone", []string{bin}},
	} {
		t.Run(c.name, func(t *testing.T) {
			run := func(pkg string) (string, int) {
				cmd := exec.Command(c.args[0], append(c.args[1:], pkg)...)
				cmd.Dir = "../.."
				out, err := cmd.CombinedOutput()
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					return string(out), ee.ExitCode()
				}
				if err != nil {
					t.Fatal(err)
				}
				return string(out), 0
			}
			out, code := run(bad)
			if code == 0 {
				t.Errorf("%s exits 0 on the bad package:\n%s", c.name, out)
			}
			for _, frag := range []string{"is not the checked wrapper", "outside the ledger packages", "is not closed, returned, stored or passed on",
				"the error of RequireVirtualBacking is ignored", "device work on the memory of", "//memvet:allow needs a reason"} {
				if !strings.Contains(out, frag) {
					t.Errorf("%s on the bad package: no finding %q in\n%s", c.name, frag, out)
				}
			}
			if out, code := run(good); code != 0 || strings.TrimSpace(out) != "" {
				t.Errorf("%s on the good package: exit %d\n%s", c.name, code, out)
			}
		})
	}
}
