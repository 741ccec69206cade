package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/internal/xproctest"
)

// proc is a running llamaserve process and the address it serves on.
type proc struct {
	cmd  *exec.Cmd
	addr string
	done chan error
}

// need returns the environment's path named key, or skips (fails under
// CI=true or MEMGEN_LLAMACPP_REQUIRE=1) when it is not there.
func need(t *testing.T, key string) string {
	t.Helper()
	v := os.Getenv(key)
	if _, err := os.Stat(v); v == "" || err != nil {
		msg := fmt.Sprintf("%s is not set to an existing file (scripts/llamacpp.sh writes it)", key)
		if os.Getenv("CI") == "true" || os.Getenv("MEMGEN_LLAMACPP_REQUIRE") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return v
}

// build builds llamaserve into a temporary directory.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "llamaserve")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

var servingOn = regexp.MustCompile(`serving .* on http://(\S+) `)

// start runs llamaserve with args and waits for the address it serves on.
func start(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-listen", "127.0.0.1:0"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e := &proc{cmd: cmd, done: make(chan error, 1)}
	addr := make(chan string, 1)
	var log strings.Builder
	go func() {
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			log.WriteString(s.Text() + "\n")
			if m := servingOn.FindStringSubmatch(s.Text()); m != nil {
				addr <- m[1]
			}
		}
		e.done <- cmd.Wait()
	}()
	select {
	case e.addr = <-addr:
	case err := <-e.done:
		t.Fatalf("llamaserve %q ended before serving: %v\n%s", args, err, log.String())
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("llamaserve %q did not serve within 2 minutes", args)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-e.done
		}
	})
	return e
}

// stop sends SIGTERM and waits for a clean exit.
func (e *proc) stop(t *testing.T) {
	t.Helper()
	if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-e.done:
		if err != nil {
			t.Errorf("llamaserve ended with %v after SIGTERM", err)
		}
	case <-time.After(time.Minute):
		e.cmd.Process.Kill()
		t.Fatal("llamaserve did not end within a minute of SIGTERM")
	}
}

func complete(t *testing.T, addr, body string) []int32 {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Tokens []int32 `json:"tokens"`
		} `json:"choices"`
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: status %s", addr, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("%s: %v %+v", addr, err, out)
	}
	return out.Choices[0].Tokens
}

// TestEnginesShareOneLedger: two llamaserve processes, the tiny model and
// the GQA one, join one shared ledger; each serves a completion; the
// ledger shows each process's slot with its weights, KV cache and compute
// buffers charged, the claims summing to the charge; after SIGTERM both
// slots are gone and nothing is claimed.
func TestEnginesShareOneLedger(t *testing.T) {
	lib := need(t, "MEMGEN_LLAMACPP_LIB")
	tiny := need(t, "MEMGEN_LLAMACPP_MODEL")
	gqa := need(t, "MEMGEN_LLAMACPP_GQA_MODEL")
	bin := build(t)
	ledger := xproctest.NewLedger(t, 400<<20)
	a := start(t, bin, "-lib", lib, "-model", tiny, "-nctx", "1024", "-sequences", "4", "-ledger", ledger)
	b := start(t, bin, "-lib", lib, "-model", gqa, "-nctx", "1024", "-sequences", "4", "-ledger", ledger)
	if toks := complete(t, a.addr, `{"prompt":[1,2,3,4],"max_tokens":8}`); len(toks) != 8 {
		t.Errorf("tiny: %d tokens, want 8", len(toks))
	}
	if toks := complete(t, b.addr, `{"prompt":"Hello there","max_tokens":8}`); len(toks) != 8 {
		t.Errorf("GQA: %d tokens, want 8", len(toks))
	}
	// The settlers publish each process's figures within their poll.
	deadline := time.Now().Add(10 * time.Second)
	for {
		h, slots, err := xproc.Inspect(ledger)
		if err != nil {
			t.Fatal(err)
		}
		live := 0
		for _, s := range slots {
			if s.PID != 0 && s.Charged >= 64<<20 {
				live++
			}
		}
		if live == 2 && h.Charged <= h.Claimed && h.Claimed <= h.Capacity {
			t.Logf("ledger: capacity %d, claimed %d, charged %d, two slots charged", h.Capacity, h.Claimed, h.Charged)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ledger never showed both engines charged: %+v %+v", h, slots)
		}
		time.Sleep(100 * time.Millisecond)
	}
	a.stop(t)
	b.stop(t)
	h, slots, err := xproc.Inspect(ledger)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if s.PID != 0 {
			t.Errorf("slot %d still held by %d after both engines ended", s.Index, s.PID)
		}
	}
	if h.Claimed != 0 || h.Charged != 0 {
		t.Errorf("after both engines ended the ledger holds %+v", h)
	}
}

// TestJoinRefusals: llamaserve refuses a ledger whose capacity is below
// the model's weights, and one that holds the weights but not the
// engine's start (the tiny model's: 64.03 MiB of weights, 74.37 MiB at
// start), with exit status 3 (nothing joined, the ledger as it was); a
// missing ledger, and -stock with -ledger (a stock engine allocates
// outside memgen), with exit status 1, saying why.
func TestJoinRefusals(t *testing.T) {
	lib := need(t, "MEMGEN_LLAMACPP_LIB")
	tiny := need(t, "MEMGEN_LLAMACPP_MODEL")
	bin := build(t)
	small, short, room := xproctest.NewLedger(t, 32<<20), xproctest.NewLedger(t, 70<<20), xproctest.NewLedger(t, 1<<30)
	for _, c := range []struct {
		ledger string
		extra  []string
		code   int
		says   string
	}{
		{small, nil, 3, "never fits the ledger " + small + ": the ledger's capacity of 32 MiB is below the weights alone"},
		{short, nil, 3, "never fits the ledger " + short + ": it needs 74.37 MiB at start (weights 64.03 MiB"},
		{filepath.Join(t.TempDir(), "none"), nil, 1, "no such file or directory"},
		{room, []string{"-stock"}, 1, "-stock and -ledger: a stock engine allocates outside memgen, so it cannot join a ledger"},
	} {
		args := append([]string{"-lib", lib, "-model", tiny, "-listen", "127.0.0.1:0", "-nctx", "1024", "-sequences", "4", "-ledger", c.ledger}, c.extra...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != c.code || !strings.Contains(string(out), c.says) {
			t.Errorf("-ledger %s %v: %v, want exit status %d saying %q:\n%s", c.ledger, c.extra, err, c.code, c.says, out)
		}
	}
	for _, l := range []string{small, short, room} {
		h, slots, err := xproc.Inspect(l)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range slots {
			if s.PID != 0 {
				t.Errorf("%s: the refused process took slot %d", l, s.Index)
			}
		}
		if h.Claimed != 0 || h.Charged != 0 {
			t.Errorf("%s: after the refusal the ledger holds %+v", l, h)
		}
	}
}
