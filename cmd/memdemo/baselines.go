package main

// System is one system of the comparison and what it measured on the
// workload.
type System struct {
	Name string
	Figures
}

// Baselines replays the run's trace under every baseline, on the same
// step model and a KV budget of the device budget less the served model's
// weights: static-max, static-pow2 and static-oracle (cfg.MaxContext is
// the served model's context length), then paged (blocks of
// cfg.BlockTokens tokens sharing the system prompt's full blocks, with
// vLLM's 1 % watermark).
func Baselines(cfg Config, reqs []Request) []System {
	w := Workload{Reqs: reqs, KVBudget: cfg.Budget - cfg.WeightBytes, BytesPerToken: cfg.Shape.BytesPerToken(), Step: cfg.Step}
	var out []System
	for _, r := range []Reservation{ReserveMax, ReservePow2, ReserveOracle} {
		out = append(out, System{Name: r.String(), Figures: StaticBaseline(w, r, cfg.MaxContext)})
	}
	out = append(out, System{Name: "paged", Figures: PagedBaseline(w, Paging{BlockTokens: cfg.BlockTokens, PrefixTokens: cfg.PrefixTokens, Watermark: 0.01})})
	return out
}
