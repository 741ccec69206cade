package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/internal/xproctest"
)

// need returns the environment's path named key, or skips (fails under
// CI=true or MEMGEN_ORT_REQUIRE=1) when it is not there.
func need(t *testing.T, key string) string {
	t.Helper()
	v := os.Getenv(key)
	if _, err := os.Stat(v); v == "" || err != nil {
		msg := key + " is not set to an existing file (scripts/ort.sh writes it)"
		if os.Getenv("CI") == "true" || os.Getenv("MEMGEN_ORT_REQUIRE") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return v
}

var servingOn = regexp.MustCompile(`serving .* on http://(\S+) `)

// buildServe builds ortserve into the test's temporary directory.
func buildServe(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ortserve")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startServe starts bin with args and returns its URL once it says it
// serves, within wait; it fails the test with the process's output when
// the process ends first or the wait does. The process is killed at the
// test's end unless the test waited for it.
func startServe(t *testing.T, bin string, wait time.Duration, args ...string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	addr, ended := make(chan string, 1), make(chan struct{})
	var logs strings.Builder
	var logMu sync.Mutex
	go func() {
		defer close(ended)
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			logMu.Lock()
			logs.WriteString(s.Text() + "\n")
			logMu.Unlock()
			if m := servingOn.FindStringSubmatch(s.Text()); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
	}()
	output := func() string {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.String()
	}
	select {
	case a := <-addr:
		return "http://" + a, cmd
	case <-ended:
		t.Fatalf("ortserve ended without serving:\n%s", output())
	case <-time.After(wait):
		t.Fatalf("ortserve did not serve within %v:\n%s", wait, output())
	}
	return "", nil
}

// TestServeOnLedger: ortserve joins a shared ledger, answers a completion
// (greedy, as many tokens as asked), /stats counts it, the ledger holds
// the session's workspace; a prompt token outside the vocabulary is a 400
// naming the field; after SIGTERM it exits 0 and the ledger holds nothing.
// A ledger below the engine's plan at start is refused with exit status
// 3, a missing one with 1, nothing joined.
func TestServeOnLedger(t *testing.T) {
	lib := need(t, "MEMGEN_ORT_LIB")
	model := need(t, "MEMGEN_ORT_DECODER_MODEL")
	bin := buildServe(t)
	ledger := xproctest.NewLedger(t, 256<<20)
	url, cmd := startServe(t, bin, time.Minute, "-lib", lib, "-model", model, "-listen", "127.0.0.1:0", "-sequences", "4", "-nctx", "256", "-ledger", ledger)
	post := func(body string) (int, []byte) {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
		return resp.StatusCode, []byte(b.String())
	}
	code, body := post(`{"prompt":[11,12,13,14,15],"max_tokens":16}`)
	var out struct {
		Choices []struct {
			Tokens []int64 `json:"tokens"`
		} `json:"choices"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &out) != nil || len(out.Choices) != 1 || len(out.Choices[0].Tokens) != 16 {
		t.Fatalf("completion: %d %s", code, body)
	}
	if code, body := post(`{"prompt":[5000],"max_tokens":1}`); code != http.StatusBadRequest || !strings.Contains(string(body), `"param":"prompt"`) {
		t.Errorf("a token outside the vocabulary: %d %s", code, body)
	}
	resp, err := http.Get(url + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	var st stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || st.Served != 1 || st.Running != 0 || st.Peak != 1 || st.Sequences != 4 {
		t.Errorf("/stats: %+v %v", st, err)
	}
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, _, err := xproc.Inspect(ledger)
		if err != nil {
			t.Fatal(err)
		}
		if h.Charged >= 8<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ledger never showed the session's workspace: %+v", h)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("after SIGTERM: %v", err)
	}
	if h, _, err := xproc.Inspect(ledger); err != nil || h.Claimed != 0 || h.Charged != 0 {
		t.Errorf("after the engine ended the ledger holds %+v (%v)", h, err)
	}

	// Refusals: the engine's plan against ledgers that never hold it,
	// and a ledger that is not there; nothing is joined or charged.
	for _, c := range []struct {
		name     string
		capacity uint64 // 0: no ledger
		code     int
		says     string
	}{
		{"below-the-weights", 1 << 20, 3, "below the weights alone"},
		{"below-the-start", 15 << 20, 3, "more than the ledger's capacity"},
		{"missing", 0, 1, "no such file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "none")
			if c.capacity > 0 {
				path = xproctest.NewLedger(t, c.capacity)
			}
			o, err := exec.Command(bin, "-lib", lib, "-model", model, "-listen", "127.0.0.1:0", "-ledger", path).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != c.code || !strings.Contains(string(o), c.says) {
				t.Fatalf("%v, want exit status %d saying %q:\n%s", err, c.code, c.says, o)
			}
			if c.capacity == 0 {
				return
			}
			if h, slots, err := xproc.Inspect(path); err != nil || h.Claimed != 0 || h.Charged != 0 {
				t.Errorf("after the refusal: %+v %v", h, err)
			} else {
				for _, s := range slots {
					if s.PID != 0 {
						t.Errorf("the refused engine took slot %d", s.Index)
					}
				}
			}
		})
	}
}
