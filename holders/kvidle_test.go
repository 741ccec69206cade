package holders_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/holders"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/stretchr/testify/require"
)

// TestKVIdleRequestPreemptedBeforeABusyOne: among requests of one
// priority an idle one is preempted before one whose call is under way
// (a growth waiting for memory), even when the busy one was used longer
// ago: preempting the idle one costs its recompute only, and here its
// chunk is what the busy one's growth waits for.
func TestKVIdleRequestPreemptedBeforeABusyOne(t *testing.T) {
	r := newRig(t, 2*gran, 1<<20)
	var mu sync.Mutex
	var told []string
	s := r.kv(t, governor.HolderOptions{}, func(c *holders.KVConfig) {
		c.OnPreempt = func(q *holders.Request) { mu.Lock(); told = append(told, q.ID()); mu.Unlock() }
	})
	preempted := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), told...) }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	busy, err := s.Admit(ctx, holders.RequestSpec{ID: "busy", PromptTokens: 4, MaxTokens: 64}) // 1 chunk, used first
	require.NoError(t, err)
	idle, err := s.Admit(ctx, holders.RequestSpec{ID: "idle", PromptTokens: 4, MaxTokens: 64}) // 1 chunk: the budget is full
	require.NoError(t, err)

	// idle's step is in flight while busy's growth asks: its ticket
	// preempts nobody (idle in flight, busy the asker), and busy waits.
	steps := fakes.NewContext(r.devM)
	steps.SetManualFences(true)
	st, err := steps.NewStream()
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Close()); require.NoError(t, steps.Close()) }()
	f, err := st.Record()
	require.NoError(t, err)
	require.NoError(t, idle.RecordUse(f)) // idle is now the one used last
	done := make(chan error, 1)
	go func() { done <- busy.Append(ctx, 4) }() // a second chunk
	watchdog.Within(t, watchdog.Bound, "busy's growth asking and waiting", func() {
		for s.Stats().Tickets != 1 {
			time.Sleep(time.Millisecond)
		}
	})
	require.Empty(t, preempted())
	f.(*fakes.Fence).Complete() // idle's step ended: idle, used after busy

	freed, err := s.Reclaim(context.Background(), ticket(devAuth, 1))
	require.NoError(t, err)
	require.Equal(t, []string{"idle"}, preempted(), "the idle request goes first, though the busy one was used longer ago")
	require.Equal(t, holders.Preempted, idle.State())
	require.EqualValues(t, gran, freed)
	require.NoError(t, watchdog.Recv(t, watchdog.Bound, "busy's growth", done), "busy's growth was served by idle's chunk")
	require.Equal(t, holders.Running, busy.State())
	require.Equal(t, 8, busy.Tokens())
	r.audit(t, "after")
	require.NoError(t, s.Close())
	r.audit(t, "end")
}
