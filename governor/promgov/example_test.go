package promgov_test

import (
	"fmt"

	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/governor/promgov"
	"github.com/prometheus/client_golang/prometheus"
)

func ExampleNewCollector() {
	g := governor.New(governor.Options{})
	defer g.Close()
	_ = g.AddAuthority("cuda:0", 80<<30)

	reg := prometheus.NewRegistry()
	reg.MustRegister(promgov.NewCollector(g))
	families, _ := reg.Gather()
	for _, f := range families {
		if f.GetName() == "memgen_governor_free_bytes" {
			fmt.Println(f.GetName(), f.GetMetric()[0].GetGauge().GetValue())
		}
	}
	// Output:
	// memgen_governor_free_bytes 8.589934592e+10
}
