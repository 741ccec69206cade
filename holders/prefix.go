package holders

import (
	"context"
	"errors"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// Prefix is a shared system prompt's KV: one physical backing, charged once
// to the store, mapped read-only at the start of every request admitted
// with it. It is freed when it is closed and its last request has gone.
type Prefix struct {
	// Size is the bytes the prefix occupies (and was charged): its tokens
	// rounded up to the granularity.
	Size memapi.Bytes

	store  *KVStore
	tokens int
	shared *pmm.Shared
	once   sync.Once
	err    error
}

// NewPrefix creates the backing of a prefix of tokens tokens (rounded up to
// the granularity) and, when data is not nil, writes data (at most the
// prefix's bytes) into it through a read-write view in a short-lived region
// and the store's device context. On failure nothing remains.
func (s *KVStore) NewPrefix(ctx context.Context, tokens int, data []byte) (*Prefix, error) {
	const op = "holders.KVStore.NewPrefix"
	size := memapi.Bytes(tokens) * s.bpt
	if tokens <= 0 {
		return nil, &memapi.Error{Op: op, Kind: memapi.ErrInvalidSize, Detail: "a prefix needs at least one token"}
	}
	if memapi.Bytes(len(data)) > size {
		return nil, &memapi.Error{Op: op, Kind: memapi.ErrInvalidSize, Wanted: memapi.Bytes(len(data)), Available: size, Detail: "data larger than the prefix"}
	}
	if data != nil && s.cfg.Context == nil {
		return nil, memapi.Errorf(op, memapi.ErrUnsupported, "no device context to write the prefix with (KVConfig.Context)")
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, memapi.Errorf(op, memapi.ErrClosed, "KV store is closed")
	}
	sh, err := s.bind.CreateShared(ctx, size)
	if err != nil {
		return nil, err
	}
	if data != nil {
		if err := s.fill(ctx, sh, data); err != nil {
			return nil, errors.Join(err, sh.Close())
		}
	}
	p := &Prefix{Size: sh.Size(), store: s, tokens: tokens, shared: sh}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.Join(memapi.Errorf(op, memapi.ErrClosed, "KV store closed meanwhile"), sh.Close())
	}
	s.prefixes[p] = struct{}{}
	return p, nil
}

// fill writes data at the start of sh through a read-write view.
func (s *KVStore) fill(ctx context.Context, sh *pmm.Shared, data []byte) error {
	region, err := s.bind.ReserveVirtual(ctx, sh.Size())
	if err != nil {
		return err
	}
	if _, err := region.MapShared(ctx, sh, memapi.AccessReadWrite); err != nil {
		return errors.Join(err, region.Close())
	}
	st, err := s.cfg.Context.NewStream()
	if err != nil {
		return errors.Join(err, region.Close())
	}
	err = st.CopyToDevice(region.Addr(), data)
	if err == nil {
		err = st.Synchronize(ctx)
	}
	return errors.Join(err, st.Close(), region.Close())
}

// Close drops the store's reference: no new request can use the prefix, and
// its backing is freed once the last request mapping it has gone. It is
// idempotent.
func (p *Prefix) Close() error {
	p.once.Do(func() {
		p.err = p.shared.Close()
		p.store.mu.Lock()
		delete(p.store.prefixes, p)
		p.store.mu.Unlock()
	})
	return p.err
}
