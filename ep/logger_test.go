package ep_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memgen/memgen/ep"
)

// TestNilLoggerDiscards is memgen's logging rule for ep: a nil
// Options.Logger discards diagnostics, so nothing reaches slog.Default
// (a library never logs unasked), while Stats still counts the failed free;
// a Logger that is given receives the line.
func TestNilLoggerDiscards(t *testing.T) {
	def := &syncWriter{w: &bytes.Buffer{}}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(def, nil)))
	defer slog.SetDefault(prev)

	failOnce := func(opts ep.Options) {
		c := ep.NewContext(&devCtx{}, opts)
		o, err := c.Own("w", &releaser{free: func(context.Context) error { return errors.New("device busy") }})
		require.NoError(t, err)
		require.NoError(t, o.Close())
		drain(t, c)
		require.Equal(t, uint64(1), c.Queue().Stats().Failed)
		c.Unpin()
		require.NoError(t, c.Close(context.Background(), false))
	}
	failOnce(ep.Options{})
	require.Empty(t, def.String(), "a nil Logger must not log to slog.Default")

	given := &syncWriter{w: &bytes.Buffer{}}
	failOnce(ep.Options{Logger: slog.New(slog.NewTextHandler(given, nil))})
	require.Contains(t, given.String(), "deferred free failed")
	require.Empty(t, def.String())
}
