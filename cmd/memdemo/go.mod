module github.com/memgen/memgen/cmd/memdemo

go 1.26.0

require (
	github.com/memgen/memgen v0.1.0
	github.com/memgen/memgen/governor/promgov v0.1.0
	github.com/prometheus/client_golang v1.25.0
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.2
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
	golang.org/x/term v0.48.0
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

// In this repository the core and promgov are the checkout itself (go.work
// says the same); `go install` of a tagged memdemo gets the versions above.
replace (
	github.com/memgen/memgen => ../..
	github.com/memgen/memgen/governor/promgov => ../../governor/promgov
)
