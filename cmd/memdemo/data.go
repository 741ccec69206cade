package main

import "github.com/memgen/memgen/generated/memapi"

// runData is the run's figures in the report's JSON snapshot (data.run):
// snake_case keys, numbers as numbers.
type runData struct {
	Trace             string       `json:"trace"`
	Requests          int          `json:"requests"`
	Mechanism         string       `json:"mechanism"`
	BudgetBytes       memapi.Bytes `json:"budget_bytes"`
	KVBudgetBaselines memapi.Bytes `json:"kv_budget_baselines_bytes"`
	BytesPerToken     memapi.Bytes `json:"bytes_per_token"`
	PrefixTokens      int          `json:"prefix_tokens"`
	MaxContext        int          `json:"max_context_tokens"`
	BlockTokens       int          `json:"block_tokens"`
	Preemptions       uint64       `json:"preemptions"`
	PreemptedRequests int          `json:"preempted_requests"`
	Resumed           uint64       `json:"resumed"`
	PeakChargedBytes  memapi.Bytes `json:"peak_charged_bytes"`
	PeakInUseBytes    memapi.Bytes `json:"peak_in_use_bytes"`
	PressureEvents    uint64       `json:"pressure_events"`
	Tickets           uint64       `json:"tickets"`
	ReclaimedBytes    memapi.Bytes `json:"reclaimed_bytes"`
	Offloads          uint64       `json:"offloads"`
	Reloads           uint64       `json:"reloads"`
	DeferredFrees     uint64       `json:"deferred_frees"`
	Checks            int          `json:"ledger_checks"`
	Failures          int          `json:"failures"`
	KernelChecks      int          `json:"kernel_audits"`
	DataChecks        int          `json:"read_backs"`
	Leaks             uint64       `json:"leaked_handles"`
	WallSeconds       float64      `json:"wall_seconds"`
	Activations       *poolData    `json:"activations,omitempty"` // absent with --workspace=false
	Systems           []systemData `json:"systems"`
}

// poolData is the activation workspace's figures: its pool's, and the
// device's pressure rounds (caches first).
type poolData struct {
	Steps             uint64       `json:"steps"`
	PeakHeldBytes     memapi.Bytes `json:"peak_held_bytes"`
	PeakInUseBytes    memapi.Bytes `json:"peak_in_use_bytes"`
	LargestStepBytes  memapi.Bytes `json:"largest_step_bytes"`
	ReclaimedBytes    memapi.Bytes `json:"reclaimed_bytes"`
	Reclaims          uint64       `json:"reclaims"`
	Regrowths         uint64       `json:"regrowths"`
	PressureRounds    int          `json:"pressure_rounds"`
	PoolFirstRounds   int          `json:"pool_first_rounds"`
	PoolAloneRounds   int          `json:"pool_alone_rounds"`
	PoolEmptyRounds   int          `json:"pool_empty_rounds"`
	NoTicketRounds    int          `json:"no_ticket_rounds"`
	CachesFirstFailed int          `json:"caches_first_failures"`
	Fragmentation     float64      `json:"peak_fragmentation"` // peak held / peak requested
	AllocCalls        int          `json:"alloc_calls"`
	AllocP50Seconds   float64      `json:"alloc_p50_seconds"`
	AllocP99Seconds   float64      `json:"alloc_p99_seconds"`
	AllocMaxSeconds   float64      `json:"alloc_max_seconds"`
}

// systemData is one system's figures: memgen's own, or a baseline's with
// memgen's ratios against it.
type systemData struct {
	Name             string       `json:"name"`
	Served           int          `json:"served"`
	Rejected         int          `json:"rejected"`
	PeakConcurrent   int          `json:"peak_concurrent"`
	MeanConcurrent   float64      `json:"mean_concurrent"`
	Tokens           int64        `json:"tokens"`
	Steps            int          `json:"steps"`
	SimSeconds       float64      `json:"sim_seconds"`
	TokensPerSecond  float64      `json:"tokens_per_second"`
	PeakKVBytes      memapi.Bytes `json:"peak_kv_bytes"`
	KVUtilMean       float64      `json:"kv_util_mean"`
	KVUtilAtPeak     float64      `json:"kv_util_at_peak"`
	MemgenPeakRatio  float64      `json:"memgen_peak_concurrent_ratio"`
	MemgenMeanRatio  float64      `json:"memgen_mean_concurrent_ratio"`
	MemgenThroughput float64      `json:"memgen_throughput_ratio"`
	MemgenSpeedup    float64      `json:"memgen_makespan_ratio"` // memgen's makespan / this system's, like every ratio here
}

func div(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func newRunData(cfg Config, o *Outcome, systems []System) runData {
	d := runData{Trace: o.TraceName, Requests: o.Requests, Mechanism: o.Mechanism, BudgetBytes: cfg.Budget, KVBudgetBaselines: cfg.Budget - cfg.WeightBytes,
		BytesPerToken: cfg.Shape.BytesPerToken(), PrefixTokens: cfg.PrefixTokens, MaxContext: cfg.MaxContext, BlockTokens: cfg.BlockTokens,
		Preemptions: o.Preemptions, PreemptedRequests: o.PreemptedRequests, Resumed: o.Resumed, PeakChargedBytes: o.PeakCharged, PeakInUseBytes: o.PeakInUse,
		PressureEvents: o.PressureEvents, Tickets: o.Tickets, ReclaimedBytes: o.Reclaimed, Offloads: o.Offloads, Reloads: o.Reloads,
		DeferredFrees: o.DeferredFrees, Checks: o.Checks, Failures: o.Failures, KernelChecks: o.KernelChecks, DataChecks: o.DataChecks,
		Leaks: o.Leaks, WallSeconds: o.Wall.Seconds(), Systems: []systemData{}}
	if o.PoolSteps > 0 {
		p, f := o.Pool, o.PoolPressure
		d.Activations = &poolData{Steps: o.PoolSteps, PeakHeldBytes: p.PeakSegments, PeakInUseBytes: p.PeakInUse, LargestStepBytes: o.PoolLargest,
			ReclaimedBytes: p.Reclaimed, Reclaims: p.Reclaims, Regrowths: p.SegmentAllocs,
			PressureRounds: f.Rounds, PoolFirstRounds: f.PoolFirst, PoolAloneRounds: f.PoolAlone, PoolEmptyRounds: f.PoolEmpty,
			NoTicketRounds: f.NoTicket, CachesFirstFailed: f.Violations, Fragmentation: p.PeakFragmentation(),
			AllocCalls: o.PoolLatency.N, AllocP50Seconds: o.PoolLatency.P50.Seconds(), AllocP99Seconds: o.PoolLatency.P99.Seconds(), AllocMaxSeconds: o.PoolLatency.Max.Seconds()}
	}
	for _, s := range append([]System{{Name: "memgen", Figures: o.Figures}}, systems...) {
		d.Systems = append(d.Systems, systemData{Name: s.Name, Served: s.Served, Rejected: s.Rejected, PeakConcurrent: s.PeakConcurrent,
			MeanConcurrent: s.MeanConcurrent, Tokens: s.Tokens, Steps: s.Steps, SimSeconds: s.SimTime.Seconds(), TokensPerSecond: s.Throughput(),
			PeakKVBytes: s.PeakKVBytes, KVUtilMean: s.KVUtilMean, KVUtilAtPeak: s.KVUtilAtPeak,
			MemgenPeakRatio:  div(float64(o.PeakConcurrent), float64(s.PeakConcurrent)),
			MemgenMeanRatio:  div(o.MeanConcurrent, s.MeanConcurrent),
			MemgenThroughput: div(o.Throughput(), s.Throughput()),
			MemgenSpeedup:    div(o.SimTime.Seconds(), s.SimTime.Seconds())})
	}
	return d
}
