package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/holders"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/mechanisms/cuda"
	"github.com/memgen/memgen/memreport"
	"github.com/memgen/memgen/pmm"
)

// Holder names: each is a governor holder and a series in the report.
const (
	holderKV      = "kv"
	holderModel   = "model-a"
	holderSecond  = "model-b"
	hostAuthority = memapi.AuthorityID("host")
)

// simEpoch is where simulated time starts.
var simEpoch = time.Date(2023, 11, 16, 18, 15, 46, 0, time.UTC)

// usedBytes is what both mechanisms report of the physical bytes they hold.
type usedBytes interface{ UsedBytes() memapi.Bytes }

// stack is the memory system the demo runs on: the governor over a device
// and a host authority, the manager with both devices, and the holders.
type stack struct {
	cfg   Config
	clock *simClock
	rec   *memreport.Recorder
	g     *governor.Governor

	devKey, hostKey memapi.DeviceKey
	devAuth         memapi.AuthorityID
	devMech         usedBytes
	devCPU, hostCPU *cpu.Mechanism // devCPU is nil with --mechanism cuda
	cudaMech        *cuda.Mechanism
	devDC, hostDC   memapi.DeviceContext
	devCtx, hostCtx *ep.Context
	mgr             *pmm.Manager
	kv              *holders.KVStore
	prefix          *holders.Prefix
	prefixData      []byte
	model, second   *holders.Residency
	modelW, secondW []string // weight names
	weightHead      map[string][]byte
	ws              *workspace // nil with --workspace=false
	rounds          *pressureRounds
	queueErrs       *errorLog
	onPreempt       func(*holders.Request)
}

// errorLog keeps the first errors a background party reported.
type errorLog struct {
	mu    sync.Mutex
	n     int
	first []string
}

func (l *errorLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	if len(l.first) < 20 {
		l.first = append(l.first, fmt.Sprintf(format, args...))
	}
}

func (l *errorLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// newStack builds the memory system. On failure everything built so far is
// torn down.
func newStack(ctx context.Context, cfg Config, rec *memreport.Recorder, log *slog.Logger) (_ *stack, err error) {
	s := &stack{cfg: cfg, clock: newSimClock(simEpoch), rec: rec, queueErrs: &errorLog{}, weightHead: map[string][]byte{}}
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	s.g = governor.New(governor.Options{Clock: s.clock, Logger: log, OnEvent: s.event})
	undo = append(undo, func() { _ = s.g.Close(); s.clock.Close() })

	s.hostKey = memapi.DeviceKey{Kind: memapi.DeviceKindHost, Ordinal: 1}
	s.hostCPU, err = cpu.New(cpu.Options{Authority: hostAuthority, Ordinal: 1})
	if err != nil {
		return nil, err
	}
	s.hostDC = cpu.NewContext(s.hostCPU)
	var devMech memapi.Mechanism
	switch cfg.Mechanism {
	case "cpu":
		s.devKey = memapi.DeviceKey{Kind: memapi.DeviceKindHost, Ordinal: 0}
		s.devAuth = "cpu:0"
		if cfg.Authority != "" {
			s.devAuth = memapi.AuthorityID(cfg.Authority)
		}
		s.devCPU, err = cpu.New(cpu.Options{Granularity: cfg.Granularity, Authority: s.devAuth})
		if err != nil {
			return nil, fmt.Errorf("--granularity %s: %w", formatSize(cfg.Granularity), err)
		}
		s.devDC, devMech, s.devMech = cpu.NewContext(s.devCPU), s.devCPU, s.devCPU
	case "cuda":
		s.cudaMech, err = cuda.New(cuda.Config{Authority: memapi.AuthorityID(cfg.Authority)})
		if err != nil {
			return nil, fmt.Errorf("--mechanism cuda: %w", err)
		}
		undo = append(undo, func() { _ = s.cudaMech.Close() })
		s.devKey = s.cudaMech.Info().Device
		s.devAuth = s.cudaMech.Info().Authority
		dc, cerr := s.cudaMech.NewContext()
		if cerr != nil {
			return nil, cerr
		}
		s.devDC, devMech, s.devMech = dc, s.cudaMech, s.cudaMech
	}
	s.rounds = &pressureRounds{auth: s.devAuth}
	opts := ep.Options{Logger: log, OnError: func(name string, err error) { s.queueErrs.add("deferred free %s: %v", name, err) }}
	s.devCtx = ep.NewContext(s.devDC, opts)
	s.hostCtx = ep.NewContext(s.hostDC, opts)
	undo = append(undo, func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.devCtx.Close(c, true)
		_ = s.hostCtx.Close(c, true)
	})
	if err := s.g.AddAuthority(s.devAuth, cfg.Budget); err != nil {
		return nil, err
	}
	if err := s.g.AddAuthority(hostAuthority, cfg.HostBudget); err != nil {
		return nil, err
	}
	s.mgr = pmm.New(s.g, pmm.Options{Verify: true})
	if err := s.mgr.Register(pmm.Device{Key: s.devKey, Mechanism: devMech, Context: s.devCtx, Authority: s.devAuth}); err != nil {
		return nil, err
	}
	if err := s.mgr.Register(pmm.Device{Key: s.hostKey, Mechanism: s.hostCPU, Context: s.hostCtx, Authority: hostAuthority}); err != nil {
		return nil, err
	}

	// Holders: the second model is asked first under pressure (it can be
	// offloaded), then the KV store (it preempts requests); the served
	// model is pinned.
	s.kv, err = holders.NewKVStore(holders.KVConfig{Manager: s.mgr, Device: s.devKey, Holder: holderKV, Role: "kv-cache", Priority: 10,
		Shape: cfg.Shape, Context: s.devDC, OnPreempt: func(r *holders.Request) {
			if s.onPreempt != nil {
				s.onPreempt(r)
			}
		}})
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { _ = s.kv.Close() })
	s.model, err = s.residency(holderModel, 20, 0)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { _ = s.model.Close() })
	if cfg.SecondBytes > 0 {
		s.second, err = s.residency(holderSecond, 0, cfg.SecondHotFor)
		if err != nil {
			return nil, err
		}
		undo = append(undo, func() { _ = s.second.Close() })
	}
	for _, h := range []struct {
		id   string
		h    governor.Holder
		prio int
		role string
	}{{holderKV, s.kv, 10, "kv-cache"}, {holderModel, s.model, 20, "weights"}, {holderSecond, s.second, 0, "weights"}} {
		if h.id == holderSecond && s.second == nil {
			continue
		}
		if err := s.g.Register(governor.HolderID(h.id), h.h, governor.HolderOptions{Priority: h.prio}); err != nil {
			return nil, err
		}
		rec.Label(governor.HolderID(h.id), h.role)
	}
	if cfg.Workspace {
		m, err := s.mgr.Mechanism(s.devKey)
		if err != nil {
			return nil, err
		}
		if s.ws, err = newWorkspace(s, m.Info().Granularity); err != nil {
			return nil, fmt.Errorf("the activation workspace: %w", err)
		}
		undo = append(undo, func() { _ = s.ws.close() })
		if err := s.ws.register(s.g); err != nil {
			return nil, err
		}
		rec.Label(holderPool, "activations")
		s.rounds.setPool(s.ws.pool.Stats)
	}

	// Weights: one tensor per layer, the head of each written with a
	// pattern the audits read back (after offload and reload too).
	if s.modelW, err = s.load(ctx, s.model, "a", cfg.WeightBytes, true); err != nil {
		return nil, fmt.Errorf("loading the served model's weights: %w", err)
	}
	if s.second != nil {
		if s.secondW, err = s.load(ctx, s.second, "b", cfg.SecondBytes, false); err != nil {
			return nil, fmt.Errorf("loading the second model's weights: %w", err)
		}
	}
	if cfg.PrefixTokens > 0 {
		bpt := cfg.Shape.BytesPerToken()
		s.prefixData = pattern("prefix", int(memapi.Bytes(cfg.PrefixTokens)*bpt))
		if s.prefix, err = s.kv.NewPrefix(ctx, cfg.PrefixTokens, s.prefixData); err != nil {
			return nil, fmt.Errorf("creating the shared prefix: %w", err)
		}
	}
	return s, nil
}

func (s *stack) residency(holder string, prio int, hot time.Duration) (*holders.Residency, error) {
	return holders.NewResidency(holders.ResidencyConfig{
		Manager: s.mgr, Device: s.devKey, DeviceContext: s.devDC, Host: s.hostKey, HostContext: s.hostDC,
		Holder: holder, Role: "weights", Priority: prio, HotFor: hot, Clock: s.clock.Now,
	})
}

// weightHeadBytes is how much of each weight is written with a pattern and
// read back by the audits.
const weightHeadBytes = 64 << 10

func (s *stack) load(ctx context.Context, r *holders.Residency, model string, total memapi.Bytes, pinned bool) ([]string, error) {
	page := memapi.Bytes(4096)
	layers := memapi.Bytes(s.cfg.Shape.Layers)
	per := (total/layers + page - 1) / page * page
	var names []string
	for i := memapi.Bytes(0); i < layers; i++ {
		name := fmt.Sprintf("%s/layer.%02d", model, i)
		head := pattern(name, int(min(per, weightHeadBytes)))
		if err := r.Load(ctx, holders.WeightSpec{Name: name, Size: per, Data: head, Pinned: pinned}); err != nil {
			return names, err
		}
		s.weightHead[name] = head
		names = append(names, name)
	}
	return names, nil
}

// pattern returns n deterministic bytes that differ by name.
func pattern(name string, n int) []byte {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(name); i++ {
		h = (h ^ uint64(name[i])) * 1099511628211
	}
	out := make([]byte, n)
	for i := range out {
		h ^= h << 13
		h ^= h >> 7
		h ^= h << 17
		out[i] = byte(h)
	}
	return out
}

// event is the governor's event hook: it feeds the report, where a ticket
// the second model answered with freed bytes is also an offload.
func (s *stack) event(e governor.Event) {
	s.rec.Event(e)
	if s.rounds != nil {
		s.rounds.event(e)
	}
	if e.Kind == governor.EventReclaimed && e.Holder == holderSecond && e.Bytes > 0 {
		s.rec.Annotate(memreport.Annotation{Time: e.Time, Authority: e.Authority, Kind: "offload", Holder: holderSecond, Bytes: e.Bytes,
			Detail: fmt.Sprintf("weights to the host, answering ticket %d", e.Ticket.ID)})
	}
}

// close tears the stack down: the activation pool and holders first (their memory goes through the
// deferred-free queues), then the contexts (which wait for the queues), the
// governor, and the CUDA mechanism.
func (s *stack) close(ctx context.Context) error {
	var errs []error
	if s.ws != nil {
		errs = append(errs, s.ws.close()) // the pool before the manager's contexts close
	}
	if s.prefix != nil {
		errs = append(errs, s.prefix.Close())
	}
	errs = append(errs, s.kv.Close(), s.model.Close())
	if s.second != nil {
		errs = append(errs, s.second.Close())
	}
	errs = append(errs, s.devCtx.Close(ctx, true), s.hostCtx.Close(ctx, true))
	errs = append(errs, s.g.Close())
	s.clock.Close()
	if s.cudaMech != nil {
		errs = append(errs, s.cudaMech.Close())
	}
	return errors.Join(errs...)
}
