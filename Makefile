# memgen's everyday commands. Every target works on a fresh clone with only Go
# installed (modules come through the Go module proxy); GOTOOLCHAIN=local keeps
# the go command from downloading another toolchain.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
export GOTOOLCHAIN := local

GO ?= go

# Go files tracked or about to be (untracked but not ignored).
GO_FILES = $(shell git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*')

# Benchmarks that have a goal, as package:regexp. Add yours here; `make bench`
# runs them all and prints a short table last.
BENCHES ?= ./gen:^BenchmarkGenerate$$ \
	./internal/checkedtest:^BenchmarkChecked$$//paired \
	./mechanisms/cpu:^BenchmarkCommit$$ \
	./governor:^BenchmarkCycle$$ ./governor:^BenchmarkRefundToWake$$ \
	./pmm:. \
	./holders:^BenchmarkKVAppend$$
BENCHTIME ?= 1s
BENCHCOUNT ?= 1
BENCH_OUT ?= out/bench.txt

.PHONY: all generate check drift vet fmt-check test test-short bench fuzz fuzz-ci regen-stable ci

all: check test

## generate: regenerate everything from spec/capabilities.yaml
generate:
	$(GO) generate ./...

## check: spec, drift and implementation check; go vet; gofmt
check: drift vet fmt-check

drift:
	$(GO) run ./cmd/memgen check

vet:
	$(GO) vet ./...

fmt-check:
	@bad="$$(gofmt -l $(GO_FILES))"; \
	if [ -n "$$bad" ]; then echo "gofmt needed on:"; echo "$$bad"; exit 1; fi

## test: the README's test command
test:
	$(GO) test -race ./...

test-short:
	$(GO) test -short ./...

## bench: every benchmark with a goal, then a table of ns/op, allocs/op and ratios
bench:
	@mkdir -p $(dir $(BENCH_OUT)); : > $(BENCH_OUT)
	@for b in $(BENCHES); do \
		pkg="$${b%%:*}"; re="$${b#*:}"; \
		echo "== $$pkg $$re"; \
		$(GO) test -run '^$$' -bench "$$re" -benchmem -benchtime $(BENCHTIME) -count $(BENCHCOUNT) "$$pkg" | tee -a $(BENCH_OUT); \
	done
	@echo; echo "benchmark | ns/op | allocs/op | ratios"; echo "--- | --- | --- | ---"
	@awk '/^Benchmark/ { ns=""; al=""; r=""; \
		for (i = 3; i < NF; i++) { \
			if ($$(i+1) == "ns/op") ns = $$i; \
			else if ($$(i+1) == "allocs/op") al = $$i; \
			else if ($$(i+1) ~ /^x-vs-/) r = r $$(i+1) "=" $$i " "; \
		} \
		print $$1 " | " ns " | " al " | " r }' $(BENCH_OUT)

## fuzz: shake the spec loader (FUZZTIME=60s by default)
FUZZTIME ?= 60s
fuzz:
	$(GO) test ./gen -run '^$$' -fuzz '^FuzzLoad$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s

## fuzz-ci: both fuzz targets of the generator for a bounded time each (FUZZCI_TIME, 12s by default:
## about half a minute in all), as CI runs them: FuzzLoad (the loader never panics, every error has a
## position) and FuzzGenerate (whatever the loader accepts generates Go that type-checks)
FUZZCI_TIME ?= 12s
fuzz-ci:
	$(GO) test ./gen -run '^$$' -fuzz '^FuzzLoad$$' -fuzztime $(FUZZCI_TIME) -fuzzminimizetime 5s
	$(GO) test ./gen -run '^$$' -fuzz '^FuzzGenerate$$' -fuzztime $(FUZZCI_TIME) -fuzzminimizetime 5s

## regen-stable: go generate twice in a row changes no byte
regen-stable:
	$(GO) generate ./...
	@sum() { find . -path ./.git -prune -o -path ./out -prune -o -type f -print0 | sort -z | xargs -0 sha256sum; }; \
	before="$$(sum)"; \
	$(GO) generate ./...; \
	after="$$(sum)"; \
	if [ "$$before" != "$$after" ]; then \
		echo "go generate is not idempotent:"; diff <(echo "$$before") <(echo "$$after") || true; exit 1; \
	fi; \
	echo "go generate ./... twice: no byte changed"

## ci: what .ci/run runs
ci:
	.ci/run

## demo: replay 2,000 LLM requests through memgen on the CPU mechanism (under a minute), compare with a
## static baseline, write out/memory-report.html (DEMO_FLAGS adds flags, e.g. DEMO_FLAGS='--budget 256MiB')
DEMO_FLAGS ?=
.PHONY: demo
demo:
	$(GO) run ./cmd/memdemo --compare-static --report out/memory-report.html $(DEMO_FLAGS)

## ort: fetch ONNX Runtime 1.30.0, the ONNX conformance models and the MLP models (outside the repository)
## ort-test: integrations/ort (a nested module) vetted and tested under -race; SKIP line if the fetch fails
## ort-bench: integrations/ort's benchmarks (inference latency vs ONNX Runtime's arena, Alloc+Free cost)
.PHONY: ort ort-test ort-bench
ort:
	scripts/ort.sh fetch

ort-test:
	scripts/ort.sh test

ort-bench:
	scripts/ort.sh bench
