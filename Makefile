# memgen's everyday commands. Every target works on a fresh clone with only Go
# installed (modules come through the Go module proxy); GOTOOLCHAIN=local keeps
# the go command from downloading another toolchain.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
export GOTOOLCHAIN := local

GO ?= go

# Go files tracked or about to be (untracked but not ignored).
GO_FILES = $(shell git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*')

# Benchmarks that have a goal, as package:regexp, or package:regexp@benchtime for
# one that needs its own -benchtime (the paired checked-wrapper benchmark collects
# garbage untimed before every batch, so under a time target its b.N, and its
# untimed work, grow without bound: it runs a fixed count of calls). Add yours
# here; `make bench` runs them all and prints a short table last.
BENCHES ?= ./gen:^BenchmarkGenerate$$ \
	./internal/checkedtest:^BenchmarkChecked$$///paired@25600x \
	./mechanisms/cpu:^BenchmarkCommit$$ \
	./governor:^BenchmarkCycle$$ ./governor:^BenchmarkRefundToWake$$ \
	./pmm:. \
	./holders:^BenchmarkKVAppend$$ \
	./pool:. \
	./mechanisms/plugin:^BenchmarkABIOverhead$$ \
	./governor/xproc:^BenchmarkReserve$$
BENCHTIME ?= 1s
BENCHCOUNT ?= 1
BENCH_OUT ?= out/bench.txt

# The nested modules that `go test ./...` here does not enter, each vetted,
# checked and tested from its own directory. integrations/ort (cgo, ONNX
# Runtime) and integrations/llamacpp (cgo, llama.cpp) have their own targets
# below; their go.mod files are still tidy-checked.
MODULES := governor/promgov cmd/memdemo
TIDY_MODULES := . $(MODULES) integrations/ort integrations/llamacpp

# staticcheck, pinned; `go run` builds it from the module proxy (no install).
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all generate check drift vet tmpl-vet fmt-check tidy-check core-graph staticcheck test test-modules test-short bench fuzz fuzz-ci xproc-soak xproc-trials regen-stable plugin-check-table ci path-table path-table-update

all: check test

## generate: regenerate everything from spec/capabilities.yaml
generate:
	$(GO) generate ./...

## check: spec, drift and implementation check; go vet (the generator's templates too); gofmt; tidy modules; the core's
## module graph free of Prometheus; staticcheck; memvet
check: drift vet tmpl-vet fmt-check tidy-check core-graph staticcheck memvet

drift:
	$(GO) run ./cmd/memgen check

# go vet's default analyzers include copylocks: a copied value holding a lock
# or an atomic fails check, over the whole module.
vet:
	$(GO) vet ./...
	@for m in $(MODULES); do echo "(cd $$m && $(GO) vet ./...)"; (cd $$m && $(GO) vet ./...); done

## tmpl-vet: the generator's templates (gen/*tmpl/*.go: plain Go under the build tag memgentmpl,
## copied into the generated packages) type-checked and vetted as the files of the packages they
## are copied into: an overlay puts each template in place of its copy, -tags memgentmpl keeps it in
## (go vet reports at the template's own path and line)
TMPL_DIRS := checkedtmpl:generated/checked conformancetmpl:generated/conformance \
	contracttmpl:generated/memapi fakestmpl:fakes
TMPL_OVERLAY ?= out/memgentmpl-overlay.json
tmpl-vet:
	@mkdir -p $(dir $(TMPL_OVERLAY)); sep=; { printf '{"Replace":{'; \
	for m in $(TMPL_DIRS); do t="$${m%%:*}"; d="$${m#*:}"; \
		for f in gen/$$t/*.go; do printf '%s\n"%s":"%s"' "$$sep" "$(CURDIR)/$$d/$${f##*/}" "$(CURDIR)/$$f"; sep=,; done; \
	done; printf '}}\n'; } > $(TMPL_OVERLAY)
	$(GO) vet -tags memgentmpl -overlay $(TMPL_OVERLAY) $(foreach m,$(TMPL_DIRS),./$(word 2,$(subst :, ,$(m))))

## tidy-check: every module's go.mod and go.sum are what `go mod tidy` writes
tidy-check:
	@for m in $(TIDY_MODULES); do \
		(cd $$m && $(GO) mod tidy -diff) || { echo "go mod tidy needed in $$m"; exit 1; }; \
	done; echo "go mod tidy -diff: clean in $(TIDY_MODULES)"

## core-graph: the core module's graph (without go.work) holds no Prometheus or protobuf
core-graph:
	@graph="$$(GOWORK=off $(GO) mod graph)"; \
	if grep -E 'prometheus|protobuf' <<<"$$graph"; then \
		echo "the core module's graph reaches the modules above: keep them in a nested module"; exit 1; \
	fi; echo "go mod graph (core, GOWORK=off): $$(wc -l <<<"$$graph") edges, no prometheus, no protobuf"

staticcheck:
	$(GO) run $(STATICCHECK) ./...
	@for m in $(MODULES); do echo "(cd $$m && $(GO) run $(STATICCHECK) ./...)"; (cd $$m && $(GO) run $(STATICCHECK) ./...); done
	@# integrations/ort builds with cgo against its own go.mod (no ONNX Runtime needed to check it)
	cd integrations/ort && GOWORK=off $(GO) run $(STATICCHECK) ./...
	@# integrations/llamacpp likewise (llama.cpp is loaded with dlopen at run time only)
	cd integrations/llamacpp && GOWORK=off $(GO) run $(STATICCHECK) ./...

fmt-check:
	@bad="$$(gofmt -l $(GO_FILES))"; \
	if [ -n "$$bad" ]; then echo "gofmt needed on:"; echo "$$bad"; exit 1; fi

## test: the README's test command (the core module)
test:
	$(GO) test -race ./...

## test-modules: the nested modules' tests (integrations/ort: make ort-test)
test-modules:
	@for m in $(MODULES); do echo "(cd $$m && $(GO) test -race ./...)"; (cd $$m && $(GO) test -race ./...); done

test-short:
	$(GO) test -short ./...

## path-table: measure the functions the common operations enter (coverage counters around each call) and
## fail when docs/pmm.md's path table disagrees; path-table-update rewrites the table
PATHTABLE = GOCOVERDIR=$$(mktemp -d) $(GO) run -cover -covermode=atomic -coverpkg=github.com/memgen/memgen/... ./internal/pathtable/measure
path-table:
	$(PATHTABLE)

path-table-update:
	$(PATHTABLE) -update

## bench: every benchmark with a goal, then a table of ns/op, allocs/op and ratios
bench:
	@mkdir -p $(dir $(BENCH_OUT)); : > $(BENCH_OUT)
	@for b in $(BENCHES); do \
		pkg="$${b%%:*}"; re="$${b#*:}"; bt="$(BENCHTIME)"; \
		case "$$re" in *@*) bt="$${re##*@}"; re="$${re%@*}";; esac; \
		echo "== $$pkg $$re (-benchtime $$bt)"; \
		$(GO) test -run '^$$' -bench "$$re" -benchmem -benchtime "$$bt" -count $(BENCHCOUNT) "$$pkg" | tee -a $(BENCH_OUT); \
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

## xproc-soak: 1,000 kill -9 trials of a process sharing a ledger (XPROC_TRIALS: reclaim times,
## median, p99, worst), 200 kill -9 trials of CUDA processes with the default pool on a shared
## simulated device (XPROC_CUDA_TRIALS: driver out-of-memory errors, drift), the bytes a want's
## answers free with 2, 6 and 12 processes, and the ledger file's parser fuzzed (FUZZTIME). The
## kill trials build without the race detector (XPROC_SOAK_FLAGS adds flags): its runtime makes a
## killed process's teardown, which the reclaim waits for, several times slower; the unit tests
## run the same code under -race
XPROC_TRIALS ?= 1000
XPROC_CUDA_TRIALS ?= 200
XPROC_SOAK_FLAGS ?=
xproc-soak:
	MEMGEN_XPROC_TRIALS=$(XPROC_TRIALS) $(GO) test $(XPROC_SOAK_FLAGS) -count=1 -run '^TestKillNine$$' -v ./governor/xproc/ | grep -E '^(---|ok|FAIL|PASS|\s+kill_test)'
	MEMGEN_XPROC_CUDA_TRIALS=$(XPROC_CUDA_TRIALS) $(GO) test $(XPROC_SOAK_FLAGS) -count=1 -run '^TestKillNineCUDA$$' -v ./governor/xproc/ | grep -E '^(---|ok|FAIL|PASS|\s+killcuda_test)'
	MEMGEN_XPROC_ANSWERS=2,6,12 $(GO) test -race -count=1 -run '^TestBoundedAnswers$$' -v ./governor/xproc/ | grep -E '^(\s*---|ok|FAIL|PASS|\s+want_test)'
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./governor/xproc/

## xproc-trials: the shared ledger's trials with 8, 16 and 32 processes (XPROC_MEMBERS) and 50 kills
## each (XPROC_KILLS): reclaim and Inspect latencies while the members churn CUDA memory on a simulated
## device whose capacity is the ledger's, driver out-of-memory errors and drift, a context.Background()
## reservation behind a stopped lock holder, the bytes freed for a dead wanter, the fan-out of a want, a
## flipped bit under the members. The churning processes spin (XPROC_CHURN_PAUSE, a Go duration, pauses
## each between two operations). Printed, not judged; the test command runs 4 processes and 5 kills
XPROC_MEMBERS ?= 8,16,32
XPROC_KILLS ?= 50
XPROC_CHURN_PAUSE ?= 0
xproc-trials:
	MEMGEN_XPROC_MEMBERS=$(XPROC_MEMBERS) MEMGEN_XPROC_TRIAL_KILLS=$(XPROC_KILLS) MEMGEN_XPROC_CHURN_PAUSE=$(XPROC_CHURN_PAUSE) $(GO) test $(XPROC_SOAK_FLAGS) -count=1 -timeout 60m -run '^TestTrials$$' -v ./governor/xproc/ | grep -E '^(\s*---|ok|FAIL|PASS|\s+(trials|want)_test)'

## metamorphic-long: the metamorphic test (internal/metamorphic: the same random operations on the fakes, the CPU
## mechanism and the CUDA mechanism over the simulator, compared after every step) for METAMORPHIC_STEPS operations
## (1,000,000 by default; `go test -race ./...` runs 10,000). Without the race detector (METAMORPHIC_FLAGS adds flags:
## -race, -rapid.seed=N to replay a seed); a failure prints the seed and the shortest failing sequence
METAMORPHIC_STEPS ?= 1000000
METAMORPHIC_FLAGS ?=
.PHONY: metamorphic-long
metamorphic-long:
	MEMGEN_METAMORPHIC_STEPS=$(METAMORPHIC_STEPS) $(GO) test $(METAMORPHIC_FLAGS) -count=1 -timeout 60m -run '^TestMetamorphic$$' -v ./internal/metamorphic/

## plugin-check-table: memgen plugin-check on every broken plugin of mechanisms/plugin/testdata
## (scripts/plugin-check-table.sh): the table docs/cabi.md shows; fails when a variant is not
## reported or plugin-check dies
plugin-check-table:
	scripts/plugin-check-table.sh

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
	$(GO) run ./cmd/memdemo --compare --report out/memory-report.html $(DEMO_FLAGS)

## journey: a new adopter's path, timed, on a copy of the checkout: a downstream module catches a leak
## with its file:line, memgen new mechanism, its conformance failing then passing once written, memctl
.PHONY: journey
journey:
	bash scripts/journey.sh

## many-engines: two llama.cpp engines (tiny and GQA models) and an ONNX Runtime decoder serving a trace slice on one
## shared ledger, then on static thirds of the same budget, in a memory cgroup where one can be made;
## MANY_ENGINES_REQUESTS (default 128)
.PHONY: many-engines
many-engines:
	scripts/many-engines.sh

## ort: fetch ONNX Runtime 1.30.0, the ONNX conformance models and the pressure test's small MLP
## (outside the repository)
## ort-test: integrations/ort (a nested module) vetted and tested under -race; when the fetch fails a
## SKIP line and exit 0, or under CI=true a FAIL line and exit 1
## ort-bench: builds the 403 MB benchmark MLP once, then integrations/ort's benchmarks (inference
## latency vs ONNX Runtime's arena, Alloc+Free cost)
.PHONY: ort ort-test ort-bench ort-long
ort:
	scripts/ort.sh fetch

ort-test:
	scripts/ort.sh test

ort-bench:
	scripts/ort.sh bench

## ort-long: the exported decoders' tokens against ONNX Runtime's own run over 2,048 steps
ort-long:
	scripts/ort.sh long

## llamacpp: fetch llama.cpp's prebuilt CPU libraries and the release's headers (npm: node-llama-cpp 3.21.1)
## and write the tiny llama model (outside the repository; LLAMACPP_MODEL=PATH takes any llama GGUF instead)
## llamacpp-test: integrations/llamacpp (a nested module) vetted and tested under -race; when the fetch fails a
## SKIP line and exit 0, or under CI=true a FAIL line and exit 1
## llamacpp-bench: integrations/llamacpp's benchmarks (tokens/s against stock llama.cpp, memory)
## llamacpp-sleepwake: the sleep and wake tests and the two wake benchmarks, then one summary line (sleep-wake: ...)
## llamacpp-curl: the HTTP endpoint (llamaserve -listen) driven with curl (scripts/llamaserve-curl.sh)
## llamacpp-load: the endpoint under 64 clients for 60 s (TestServerLoad; CI runs it for 10 s)
## llamacpp-plan: the memory plans' accuracy on every model, a 1.1 GiB one included (written once, outside
## the repository), llamaplan on each, and the planning time
LLAMACPP_MODEL ?=
LLAMACPP_ARGS = $(if $(LLAMACPP_MODEL),--model $(LLAMACPP_MODEL))
.PHONY: llamacpp llamacpp-test llamacpp-bench llamacpp-sleepwake llamacpp-curl llamacpp-load llamacpp-plan
llamacpp:
	scripts/llamacpp.sh fetch $(LLAMACPP_ARGS)

llamacpp-test:
	scripts/llamacpp.sh test $(LLAMACPP_ARGS)

llamacpp-bench:
	scripts/llamacpp.sh bench $(LLAMACPP_ARGS)

llamacpp-sleepwake:
	scripts/llamacpp.sh sleepwake $(LLAMACPP_ARGS)

llamacpp-curl:
	scripts/llamacpp.sh curl $(LLAMACPP_ARGS)

llamacpp-load:
	scripts/llamacpp.sh load $(LLAMACPP_ARGS)

llamacpp-plan:
	scripts/llamacpp.sh plan $(LLAMACPP_ARGS)

## memvet: memgen's static checks (cmd/memvet: nobypass, handleclose, unsupported, recorduse, the allow
## escape) over the module and every nested module, through go vet -vettool; any finding fails
## memvet-time: memvet's run time over the module next to go vet's in the same run, both from cold vet
## results over a warm build (a fresh GOCACHE warmed by one run with every memvet analyzer off): the ratio
MEMVET ?= out/memvet
.PHONY: memvet memvet-time
memvet:
	@mkdir -p $(dir $(MEMVET))
	$(GO) build -o $(MEMVET) ./cmd/memvet
	$(GO) vet -vettool=$(abspath $(MEMVET)) ./...
	@for m in $$(git ls-files '*/go.mod' 2>/dev/null || find . -mindepth 2 -name go.mod -not -path '*/testdata/*'); do \
		d="$$(dirname "$$m")"; echo "memvet: $$d"; \
		(cd "$$d" && $(GO) vet -vettool=$(abspath $(MEMVET)) ./...); \
	done

memvet-time:
	@tmp="$$(mktemp -d)"; trap 'rm -rf "$$tmp"' EXIT; export GOCACHE="$$tmp/cache"; \
	$(GO) build -o "$$tmp/memvet" ./cmd/memvet; \
	off="$$("$$tmp/memvet" help 2>&1 | awk '/^    [a-z]+ /{printf "-%s=false ", $$1}')"; \
	$(GO) vet -vettool="$$tmp/memvet" $$off ./... ; \
	t0=$$(date +%s.%N); $(GO) vet ./...; t1=$$(date +%s.%N); \
	$(GO) vet -vettool="$$tmp/memvet" ./...; t2=$$(date +%s.%N); \
	"$$tmp/memvet" ./...; t3=$$(date +%s.%N); \
	awk -v t0="$$t0" -v t1="$$t1" -v t2="$$t2" -v t3="$$t3" 'BEGIN { v = t1 - t0; m = t2 - t1; s = t3 - t2; \
		printf "go vet ./...                      %6.1f s\n", v; \
		printf "go vet -vettool=memvet ./...      %6.1f s   %.2fx-vs-go-vet\n", m, m / v; \
		printf "memvet ./... (standalone)         %6.1f s   %.2fx-vs-go-vet\n", s, s / v }'
