package pmm_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
	"github.com/stretchr/testify/require"
)

// transferSide is one end of a Transfer over a fake mechanism: its context,
// the allocation Transfer copies from or into, and the streams Transfer
// asked the context for.
type transferSide struct {
	m       *fakes.Mechanism
	ctx     *fakes.Context
	a       *memapi.Allocation
	streams []*fakes.Stream
	fault   *fakes.Fault // injected into the stream Transfer makes
}

func newTransferSide(t *testing.T, auth memapi.AuthorityID, n memapi.Bytes) *transferSide {
	t.Helper()
	s := &transferSide{m: fakes.NewMechanism(fakes.Config{Authority: auth})}
	s.ctx = fakes.NewContext(s.m)
	a, err := s.m.Allocate(context.Background(), memapi.AllocRequest{Size: n}, fakes.NewGrant(auth, n))
	require.NoError(t, err)
	s.a = a
	// Transfer's streams are the context's own (the state model's), with
	// the side's fault, if any, injected before Transfer uses them.
	model := fakes.NewContext(s.m)
	s.ctx.NewStreamCalls(func() (memapi.Stream, error) {
		st, err := model.NewStream()
		if err != nil {
			return nil, err
		}
		fs := st.(*fakes.Stream)
		if s.fault != nil {
			fs.Inject(*s.fault)
		}
		s.streams = append(s.streams, fs)
		return fs, nil
	})
	return s
}

// TestTransferFailsAtEveryStep: a failure at any step of a chunked Transfer
// (either stream's creation, a copy out or in, a synchronization, either
// stream's Close) is returned, and every stream Transfer made is closed; a
// Transfer with no fault copies every byte, the last chunk short.
func TestTransferFailsAtEveryStep(t *testing.T) {
	const n, chunk = 10 << 10, 4 << 10 // three chunks, the last 2 KiB
	pattern := make([]byte, n)
	for i := range pattern {
		pattern[i] = byte(i*7 + i>>8)
	}
	type step struct {
		side, method string
		nth          int // 0: the context's NewStream
	}
	steps := []step{
		{"src", "NewStream", 0}, {"dst", "NewStream", 0},
		{"src", "CopyFromDevice", 2}, {"src", "Synchronize", 2},
		{"dst", "CopyToDevice", 2}, {"dst", "Synchronize", 2},
		{"src", "Close", 1}, {"dst", "Close", 1},
		{"none", "", 0},
	}
	for _, st := range steps {
		t.Run(fmt.Sprintf("%s/%s/%d", st.side, st.method, st.nth), func(t *testing.T) {
			src := newTransferSide(t, "device", n)
			dst := newTransferSide(t, "host", n)
			require.NoError(t, src.m.WriteMemory(src.a.Addr(), pattern))
			side := map[string]*transferSide{"src": src, "dst": dst}[st.side]
			switch {
			case side == nil:
			case st.method == "NewStream":
				side.ctx.Inject(fakes.Fault{Method: "NewStream", Err: memapi.ErrUnavailable})
			default:
				side.fault = &fakes.Fault{Method: st.method, Nth: st.nth, Err: memapi.ErrUnavailable}
			}

			err := pmm.Transfer(context.Background(), chunk, dst.ctx, dst.a.Addr(), src.ctx, src.a.Addr(), n)

			for _, s := range []*transferSide{src, dst} {
				for _, fs := range s.streams {
					require.Equal(t, 1, fs.CloseCallCount(), "every stream Transfer made is closed once")
				}
			}
			got := make([]byte, n)
			require.NoError(t, dst.m.ReadMemory(dst.a.Addr(), got))
			if side == nil {
				require.NoError(t, err)
				require.True(t, bytes.Equal(pattern, got), "the copy differs")
				return
			}
			require.ErrorIs(t, err, memapi.ErrUnavailable, "the step's failure is returned")
			switch st.method {
			case "Close": // after every copy: the bytes are there, the error too
				require.True(t, bytes.Equal(pattern, got), "the copy differs")
			case "NewStream": // the source's stream comes first
				require.Len(t, src.streams, map[string]int{"src": 0, "dst": 1}[st.side])
				require.Empty(t, dst.streams)
				require.True(t, bytes.Equal(make([]byte, n), got), "nothing was copied")
			default: // the first chunk made it, the failing one did not finish
				require.True(t, bytes.Equal(pattern[:chunk], got[:chunk]), "the first chunk differs")
				require.False(t, bytes.Equal(pattern, got), "a failed transfer copied every byte")
			}
		})
	}
}
