package plugin

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

// stackMoveChild marks the child run of TestArgumentsSurviveStackMoves.
const stackMoveChild = "MEMGEN_PLUGIN_STACKMOVE_CHILD"

// TestArgumentsSurviveStackMoves runs the conformance suite and the
// configuration and last_error test again in a child `go test` whose build
// of this package moves the goroutine's stack at every function entry
// (-d=maymorestack=runtime.mayMoreStackMove). A pointer argument that
// reached the C side as the address of a stack variable, instead of heap
// memory kept by go:uintptrescapes, then points into a stack that has moved
// away, and the plugin's answer is lost: the child fails. (A normal build
// moves stacks too rarely for that to show.)
func TestArgumentsSurviveStackMoves(t *testing.T) {
	if os.Getenv(stackMoveChild) != "" {
		t.Skip("the child run itself")
	}
	if testing.Short() {
		t.Skip("builds the package again: not in -short")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	cc(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "test", "-count=1", "-timeout=4m",
		"-run", "^(TestConformance|TestConfigAndLastError)$",
		"-gcflags=github.com/memgen/memgen/mechanisms/plugin=-d=maymorestack=runtime.mayMoreStackMove", ".")
	cmd.Env = append(os.Environ(), stackMoveChild+"=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the suite with a stack move at every function entry: %v\n%s", err, out)
	}
}
