package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memgen/memgen/internal/xproctest"
)

func decoder(t *testing.T) string {
	t.Helper()
	m := os.Getenv("MEMGEN_ORT_DECODER_MODEL")
	if m == "" {
		if dir, err := os.UserCacheDir(); err == nil {
			m = filepath.Join(dir, "memgen", "ort-1.30.0", "gqa-decoder-l4d256h4kv2s4096v1024.onnx")
		}
	}
	if _, err := os.Stat(m); err != nil {
		t.Skipf("no decoder model (scripts/ort.sh builds one): %v", err)
	}
	return m
}

// TestRun: the plan in text and JSON, its exit codes against ledgers that
// hold it, that hold only its start, and that never hold it, and the
// usage and model errors.
func TestRun(t *testing.T) {
	m := decoder(t)
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"text", []string{"-model", m, "-nctx", "1024", "-sequences", "24"}, exitOK, "96 MiB at full context"},
		{"fits", []string{"-model", m, "-ledger", xproctest.NewLedger(t, 1<<30)}, exitOK, "ledger: fits now"},
		{"starts", []string{"-model", m, "-sequences", "64", "-ledger", xproctest.NewLedger(t, 64<<20)}, exitOK, "ledger: starts now"},
		{"never", []string{"-model", m, "-ledger", xproctest.NewLedger(t, 8<<20)}, exitRefused, "below the weights alone"},
		{"missing-ledger", []string{"-model", m, "-ledger", filepath.Join(t.TempDir(), "none")}, exitFailed, "no such file"},
		{"missing-model", []string{"-model", filepath.Join(t.TempDir(), "none.onnx")}, exitFailed, "no such file"},
		{"beyond-rotary", []string{"-model", m, "-nctx", "5000"}, exitFailed, "MaxSeq 5000"},
		{"usage", []string{"-model", m, "extra"}, exitUsage, "required, and nothing else"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := run(c.args, &out, &errOut); code != c.code || !strings.Contains(out.String()+errOut.String(), c.want) {
				t.Errorf("exit %d, want %d, saying %q:\n%s%s", code, c.code, c.want, out.String(), errOut.String())
			}
		})
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"-model", m, "-nctx", "1024", "-sequences", "24", "-preallocate", "-json"}, &out, &errOut); code != exitOK {
		t.Fatalf("-json: exit %d: %s", code, errOut.String())
	}
	var o struct {
		Plan struct {
			KVFull uint64 `json:"kv_full"`
			Mode   string `json:"mode"`
		} `json:"plan"`
		AtFull, Peak uint64
	}
	if err := json.Unmarshal(out.Bytes(), &o); err != nil || o.Plan.KVFull != 24<<22 || o.Plan.Mode != "preallocated" || o.Peak < o.AtFull {
		t.Errorf("-json: %+v, %v:\n%s", o, err, out.String())
	}
}

// TestHelpFits80Columns: -h exits 0 and every line of its help (the model
// default unset) fits 80 columns, with an example and the exit codes.
func TestHelpFits80Columns(t *testing.T) {
	t.Setenv("MEMGEN_ORT_DECODER_MODEL", "")
	var out, errOut bytes.Buffer
	if code := run([]string{"-h"}, &out, &errOut); code != exitOK {
		t.Fatalf("-h: exit %d", code)
	}
	help := errOut.String()
	for _, line := range strings.Split(help, "\n") {
		if len([]rune(line)) > 80 {
			t.Errorf("a help line of %d columns: %q", len([]rune(line)), line)
		}
	}
	for _, want := range []string{"example:", "Exit codes"} {
		if !strings.Contains(help, want) {
			t.Errorf("the help lacks %q:\n%s", want, help)
		}
	}
}
