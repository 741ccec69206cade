package llamacpp

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// An idle server puts its model to sleep (the weights and KV cache move to
// the host tier), and the next request wakes it and gets the tokens an
// awake server gives.
func TestServerSleepsWhenIdle(t *testing.T) {
	r := newRig(t, 1<<30)
	tier := r.hostTier(t)
	m := loadModelAt(t, gqaModelPath, r.options())
	if _, err := NewServer(bg(t), m, ServerOptions{SleepAfter: time.Millisecond}); !errors.Is(err, memapi.ErrNilHandle) {
		t.Fatalf("SleepAfter without SleepTo: %v", err)
	}
	s, err := NewServer(bg(t), m, ServerOptions{Sequences: 2, NCtx: 512, SleepAfter: 50 * time.Millisecond, SleepTo: tier.bind})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler(nil))
	t.Cleanup(func() {
		hs.Close()
		if err := s.Close(context.Background()); err != nil && !isClosed(err) {
			t.Error(err)
		}
	})
	complete := func() []int32 {
		t.Helper()
		code, _, body := post(t, hs.URL+"/v1/completions", `{"prompt": "The ledger is", "max_tokens": 12}`)
		var c completion
		if code != http.StatusOK || json.Unmarshal(body, &c) != nil || len(c.Choices) != 1 {
			t.Fatalf("completion: %d %s", code, body)
		}
		return c.Choices[0].Tokens
	}
	awaitAsleep := func() {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !s.Stats().Asleep; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the idle server did not sleep within 30 s: %+v", s.Stats())
			}
		}
	}
	weights := r.charged(m.Holder())
	awaitAsleep() // idle from the start
	first := complete()
	awaitAsleep()
	r.settle(t)
	if w := r.charged(m.Holder()); w != 0 || r.chargedOn("sleep", offloadAuth) < weights {
		t.Fatalf("asleep: the weights hold %d on the device (were %d), the host tier %d", w, weights, r.chargedOn("sleep", offloadAuth))
	}
	if dev, _ := r.g.Authority(hostAuth); dev.Charged != r.mech.UsedBytes() {
		t.Fatalf("the device's ledger %d, its mechanism %d", dev.Charged, r.mech.UsedBytes())
	}
	second := complete()
	sameTokens(t, "server, level 1: a request after a wake against one before the sleep", second, first)
	st := s.Stats()
	if st.Sleeps < 2 || st.Wakes < 2 || st.SleepErrors != 0 {
		t.Fatalf("stats %+v: want at least two sleeps and wakes, no error", st)
	}
	t.Logf("%d sleeps, %d wakes in %v; the weights (%d bytes) waited in the host tier", st.Sleeps, st.Wakes, st.WakeTime, weights)
}

// At level 2 an idle server discards its weights (nothing goes to a host
// tier: it has none) and the next request reloads them from the model
// file and gets the tokens an awake server gives.
func TestServerSleepsLevel2(t *testing.T) {
	r := newRig(t, 1<<30)
	m := loadModelAt(t, gqaModelPath, r.options())
	if _, err := NewServer(bg(t), m, ServerOptions{SleepAfter: time.Millisecond, SleepLevel: 3}); !errors.Is(err, ErrSleepLevel) {
		t.Fatalf("SleepLevel 3: %v", err)
	}
	s, err := NewServer(bg(t), m, ServerOptions{Sequences: 2, NCtx: 512, SleepAfter: 50 * time.Millisecond, SleepLevel: 2})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler(nil))
	t.Cleanup(func() {
		hs.Close()
		if err := s.Close(context.Background()); err != nil && !isClosed(err) {
			t.Error(err)
		}
	})
	complete := func() []int32 {
		t.Helper()
		code, _, body := post(t, hs.URL+"/v1/completions", `{"prompt": "The ledger is", "max_tokens": 12}`)
		var c completion
		if code != http.StatusOK || json.Unmarshal(body, &c) != nil || len(c.Choices) != 1 {
			t.Fatalf("completion: %d %s", code, body)
		}
		return c.Choices[0].Tokens
	}
	awaitAsleep := func() {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !s.Stats().Asleep; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the idle server did not sleep within 30 s: %+v", s.Stats())
			}
		}
	}
	weights := r.charged(m.Holder())
	first := complete()
	awaitAsleep()
	r.settle(t)
	if w, st := r.charged(m.Holder()), m.SleepState(); w != 0 || st.Level != 2 || st.Discarded != weights {
		t.Fatalf("asleep: the weights hold %d on the device (were %d), state %+v", w, weights, st)
	}
	second := complete()
	sameTokens(t, "server, level 2: a request after a wake against one before the sleep", second, first)
	if st := s.Stats(); st.Sleeps < 1 || st.Wakes < 1 || st.SleepErrors != 0 {
		t.Fatalf("stats %+v: want a sleep and a wake, no error", st)
	}
}
