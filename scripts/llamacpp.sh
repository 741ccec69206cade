#!/usr/bin/env bash
# make llamacpp: fetch what integrations/llamacpp needs, outside the repository.
#
#   - llama.cpp's prebuilt CPU libraries for linux/x64 (libllama, libggml,
#     libggml-base and the CPU variants, glibc x86-64) from the npm package
#     @node-llama-cpp/linux-x64@3.21.1 (package/bins/linux-x64/), into
#     $MEMGEN_LLAMACPP_CACHE/lib (default ${XDG_CACHE_HOME:-$HOME/.cache}/memgen/llamacpp-3.21.1);
#   - the source of that release, for the headers the declarations are
#     checked against (llama.h, ggml-backend-impl.h): node-llama-cpp@3.21.1's
#     llama/gitRelease.bundle, cloned into $MEMGEN_LLAMACPP_CACHE/src;
#   - the tiny llama model the tests run (gguf.TinyShape: 512 wide, 6 layers,
#     F32 random weights from seed 1, 66 MiB), written by the module's own
#     generator (integrations/llamacpp/cmd/llamagguf) into the cache; or,
#     with --model PATH (or MEMGEN_LLAMACPP_MODEL), any llama GGUF instead;
#   - the GQA model (gguf.GQAShape: 8 layers, 4 query heads of 128 per KV
#     head, F16, 66 MiB) with the tokenizer of the source's
#     models/ggml-vocab-llama-spm.gguf (32,000 tokens) and the chat template
#     "llama2", written the same way, and the same model with its matrices
#     quantized to Q8_0 (37 MB);
#   - with `plan`, also the large model (gguf.LargeShape: 2,048 wide, 10
#     layers, F16, about 1.1 GiB), written once into the cache.
#
# Everything is reused when present. It prints the environment the tests
# read (MEMGEN_LLAMACPP_LIB, MEMGEN_LLAMACPP_SRC, MEMGEN_LLAMACPP_MODEL,
# MEMGEN_LLAMACPP_GQA_MODEL, MEMGEN_LLAMACPP_Q8_MODEL) and
# writes it to $MEMGEN_LLAMACPP_CACHE/env. Exit status 0 means everything
# is in place.
#
#   scripts/llamacpp.sh [--model PATH]        fetch (make llamacpp)
#   scripts/llamacpp.sh test [--model PATH]   fetch, then vet and test the
#                           module under -race with MEMGEN_LLAMACPP_REQUIRE=1
#                           (go test -timeout LLAMACPP_TEST_TIMEOUT, default 45m)
#                           (make llamacpp-test). When the fetch fails it
#                           prints a SKIP line and exits 0, except under CI
#                           (CI=true) or MEMGEN_LLAMACPP_REQUIRE=1, where it
#                           prints FAIL and exits 1.
#                           It also runs the resident-set and load tests
#                           without -race, and scripts/llamaserve-curl.sh.
#   scripts/llamacpp.sh bench [--model PATH]  fetch, then the module's
#                           benchmarks (make llamacpp-bench; LLAMACPP_BENCHTIME,
#                           default 1x; LLAMACPP_BENCHCOUNT, default 3), the
#                           waste table and the trace replay, and last one
#                           line: llama-batched: seqs=8 tokens-identical=yes
#                           vs-stock= vs-per-context= capacity-vs-stock=
#                           tput-vs-stock= replay-tokens-identical= waste-2MiB-4096=
#   scripts/llamacpp.sh sleepwake  fetch, then the sleep and wake tests
#                           (TestSleep*, TestServerSleeps*, llamaserve's) and
#                           BenchmarkLevel1Wake and BenchmarkLevel2Wake, and
#                           last one line, every figure taken from their
#                           output (make llamacpp-sleepwake): sleep-wake:
#                           level1-freed= level2-freed= wake1-vs-memcpy=
#                           wake2-vs-read= tokens-identical= faults= exact=
#                           (it exits 1 when a test or benchmark failed)
#   scripts/llamacpp.sh curl  fetch, then the HTTP endpoint driven with curl
#                           (scripts/llamaserve-curl.sh; make llamacpp-curl)
#   scripts/llamacpp.sh load  fetch, then TestServerLoad for
#                           LLAMACPP_LOAD_SECONDS (default 60; make llamacpp-load)
#   scripts/llamacpp.sh plan  fetch, write the large model, then the plans'
#                           accuracy (TestPlanMatchesEngine, TestPlanMatchesRSS
#                           with the large model) and llamaplan on every model
#                           (make llamacpp-plan)
#
# The module is built with GOWORK=off, against its own go.mod.
set -euo pipefail

NLC_VERSION=3.21.1
CACHE="${MEMGEN_LLAMACPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/memgen/llamacpp-$NLC_VERSION}"
LIBNAME=libllama.v0.4.0.so
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

say() { printf 'llamacpp.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

mode=fetch
case "${1:-}" in
fetch | test | bench | sleepwake | curl | load | plan) mode="$1"; shift ;;
esac
model="${MEMGEN_LLAMACPP_MODEL:-}"
while [ $# -gt 0 ]; do
	case "$1" in
	--model) model="$2"; shift 2 ;;
	--model=*) model="${1#--model=}"; shift ;;
	*) die "usage: $0 [fetch|test|bench|sleepwake|curl|load|plan] [--model PATH]" ;;
	esac
done

if [ "$mode" != fetch ]; then
	args=()
	[ -z "$model" ] || args=(--model "$model")
	if ! "$0" fetch "${args[@]}" >/dev/null; then
		what="llama.cpp (node-llama-cpp $NLC_VERSION) or its model could not be fetched (see above)"
		if [ "${CI:-}" = true ] || [ "${MEMGEN_LLAMACPP_REQUIRE:-}" = 1 ]; then
			echo "FAIL: integrations/llamacpp: $what; CI=true or MEMGEN_LLAMACPP_REQUIRE=1 requires its tests to run"
			exit 1
		fi
		echo "SKIP: integrations/llamacpp: $what; its tests did not run"
		exit 0
	fi
	while IFS='=' read -r k v; do export "$k=$v"; done <"$CACHE/env"
	export MEMGEN_LLAMACPP_REQUIRE=1 GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOWORK=off
	cd "$ROOT/integrations/llamacpp"
	if [ "$mode" = test ]; then
		go vet ./...
		bad="$(gofmt -l .)"
		[ -z "$bad" ] || { echo "gofmt needed on:"; echo "$bad"; exit 1; }
		# LLAMACPP_TEST_TIMEOUT bounds the run (go test's -timeout; its
		# expiry prints "panic: test timed out" with every stack): the
		# default fits CI's 90 minutes with the rest of .ci/run.
		# The resident-set bound and the load test's busy share are checked
		# without the race detector (its shadow memory grows with the
		# process, and it slows decoding): those two tests, built without
		# -race, before the whole suite with it; then the endpoint with curl.
		go test -count=1 -run '^(TestLedgerMatchesProcess|TestServerLoad)$' .
		go test -race -count=1 -timeout "${LLAMACPP_TEST_TIMEOUT:-45m}" ./...
		exec "$ROOT/scripts/llamaserve-curl.sh"
	fi
	if [ "$mode" = sleepwake ]; then
		# The tests log "sleepwake: ..." lines (sleep_test.go: the freed
		# percentages, each token comparison, each injected fault and
		# whether the ledger was exact after it); the benchmarks print
		# "level1-wake 2MiB: ... ratio=Rx" and "level2-wake 2MiB: ...".
		out="$(mktemp -d)"
		trap 'rm -rf "$out"' EXIT
		failed=0
		go test -count=1 -v -run '^(TestSleep|TestServerSleeps)' . ./cmd/llamaserve >"$out/tests" 2>&1 || failed=1
		grep -E '^(--- |ok|FAIL|PASS)|sleepwake: (level|fault)' "$out/tests" | grep -v 'exact=yes' || true
		go test -count=1 -run '^$' -bench '^BenchmarkLevel[12]Wake$' -benchtime 1x . >"$out/bench" 2>&1 || failed=1
		grep -E '^level[12]-wake|^Benchmark|^(ok|FAIL)' "$out/bench" || true
		if [ "$failed" != 0 ]; then
			say "a test or benchmark failed:"
			grep -h -E -B2 -A20 '^--- FAIL|^FAIL|panic:' "$out/tests" "$out/bench" | head -80 >&2 || true
		fi
		least() { sed -n "s/.*sleepwake: $1=\([0-9.]*\).*/\1/p" "$out/tests" | sort -g | head -1; }
		ratio() { sed -n "s/^$1 2MiB: .* ratio=\([0-9.]*\)x.*/\1/p" "$out/bench" | head -1; }
		l1="$(least level1-freed)"
		l2="$(least level2-freed)"
		r1="$(ratio level1-wake)"
		r2="$(ratio level2-wake)"
		yes="$(grep -c 'sleepwake: tokens-identical=yes' "$out/tests" || true)"
		no="$(grep -c 'sleepwake: tokens-identical=no' "$out/tests" || true)"
		identical=no
		[ "$failed" = 0 ] && [ "$yes" -gt 0 ] && [ "$no" = 0 ] && identical=yes
		faults="$(grep -c 'sleepwake: fault ' "$out/tests" || true)"
		exact="$(grep -c 'sleepwake: fault .*exact=yes' "$out/tests" || true)"
		say "$yes token comparisons held, $no did not"
		echo "sleep-wake: level1-freed=${l1:-?}% level2-freed=${l2:-?}% wake1-vs-memcpy=${r1:-?}x wake2-vs-read=${r2:-?}x tokens-identical=$identical faults=$faults exact=$exact"
		exit "$failed"
	fi
	if [ "$mode" = curl ]; then
		exec "$ROOT/scripts/llamaserve-curl.sh"
	fi
	if [ "$mode" = load ]; then
		LLAMACPP_LOAD_SECONDS="${LLAMACPP_LOAD_SECONDS:-60}" exec go test -count=1 -run '^TestServerLoad$' -v .
	fi
	if [ "$mode" = plan ]; then
		large="$CACHE/large-llama2-f16-seed1.gguf"
		if [ ! -f "$large" ]; then
			say "writing $large (integrations/llamacpp/cmd/llamagguf -vocab -large, seed 1)"
			go run ./cmd/llamagguf -seed 1 -large -vocab "$CACHE/src/models/ggml-vocab-llama-spm.gguf" -o "$large" ||
				die "could not write the large model"
		fi
		export MEMGEN_LLAMACPP_LARGE_MODEL="$large"
		go test -count=1 -run '^(TestPlanMatchesEngine|TestPlanMatchesRSS|TestPlanBadInput)$' -v . | grep -E '^(=== RUN|--- |ok|FAIL|PASS)|plan|planned'
		go build -o "$CACHE/llamaplan" ./cmd/llamaplan
		for m in "$MEMGEN_LLAMACPP_MODEL" "$MEMGEN_LLAMACPP_GQA_MODEL" "$MEMGEN_LLAMACPP_Q8_MODEL" "$large"; do
			"$CACHE/llamaplan" -model "$m" -nctx 4096 -sequences 8
		done
		go test -run '^$' -bench '^BenchmarkPlan$' -benchtime 5x -count 5 . | grep -E '^Benchmark'
		exit 0
	fi
	# The benchmarks, the waste table and the trace replay, then one line
	# of the batched figures (the last thing printed).
	out="$(mktemp -d)"
	trap 'rm -rf "$out"' EXIT
	go test -run '^$' -bench . -benchtime "${LLAMACPP_BENCHTIME:-1x}" -count "${LLAMACPP_BENCHCOUNT:-3}" -timeout "${LLAMACPP_BENCH_TIMEOUT:-60m}" . | tee "$out/bench"
	go test -count=1 -run '^TestWasteTable$' -v . | tee "$out/waste"
	go run ./cmd/llamaserve -lib "$MEMGEN_LLAMACPP_LIB" -model "$MEMGEN_LLAMACPP_MODEL" | tee "$out/replay"
	# BenchmarkBatchDecode's ratios (the mean of its runs; it fails unless
	# the batched tokens equal stock's), the replay's capacity and
	# throughput at equal memory, the 32-layer shape's expected waste at
	# 2 MiB and 4,096 tokens.
	ratio() { awk -v m="$1" '/^BenchmarkBatchDecode/ { for (i = 2; i < NF; i++) if ($(i+1) == m) { s += $i; n++ } } END { if (n) printf "%.2f", s / n }' "$out/bench"; }
	vs_stock="$(ratio vs-stock)"
	vs_per="$(ratio vs-per-context)"
	[ -n "$vs_stock" ] || die "no BenchmarkBatchDecode figures"
	capacity="$(sed -n 's/.*capacity-vs-stock=\([0-9.]*\)x.*/\1/p' "$out/replay")"
	tput="$(sed -n 's/.*tput-vs-stock=\([0-9.]*\)x.*/\1/p' "$out/replay")"
	identical="$(sed -n 's/.*tokens-identical=\([0-9]*\/[0-9]*\).*/\1/p' "$out/replay")"
	waste="$(awk -F'|' '$2 ~ /32 layers/ && $3 ~ /2 MiB/ && $4 ~ /^ *4096 *$/ { gsub(/[ %]/, "", $8); print $8 }' "$out/waste")"
	echo "llama-batched: seqs=8 tokens-identical=yes vs-stock=${vs_stock}x vs-per-context=${vs_per}x capacity-vs-stock=${capacity}x tput-vs-stock=${tput}x replay-tokens-identical=${identical} waste-2MiB-4096=${waste}%"
fi

case "$(uname -s)/$(uname -m)" in
Linux/x86_64) ;;
*) die "llama.cpp from @node-llama-cpp/linux-x64 is fetched for linux/x64 only (this is $(uname -s)/$(uname -m))" ;;
esac
mkdir -p "$CACHE"

# --- the libraries -----------------------------------------------------------
if [ -f "$CACHE/lib/$LIBNAME" ] && [ -f "$CACHE/lib/libggml-base.so" ]; then
	say "reusing $CACHE/lib"
else
	command -v npm >/dev/null || die "npm is needed to fetch @node-llama-cpp/linux-x64@$NLC_VERSION"
	tmp="$(mktemp -d "$CACHE/fetch.XXXXXX")"
	trap 'rm -rf "$tmp"' EXIT
	say "fetching @node-llama-cpp/linux-x64@$NLC_VERSION with npm pack"
	(cd "$tmp" && npm pack --silent "@node-llama-cpp/linux-x64@$NLC_VERSION" >/dev/null) ||
		die "npm pack @node-llama-cpp/linux-x64@$NLC_VERSION failed"
	tar -xzf "$tmp"/node-llama-cpp-linux-x64-*.tgz -C "$tmp" --wildcards 'package/bins/linux-x64/*.so' ||
		die "no package/bins/linux-x64/*.so in the package"
	[ -f "$tmp/package/bins/linux-x64/$LIBNAME" ] || die "the package has no $LIBNAME"
	rm -rf "$CACHE/lib.tmp"
	mv "$tmp/package/bins/linux-x64" "$CACHE/lib.tmp"
	rm -rf "$CACHE/lib"
	mv "$CACHE/lib.tmp" "$CACHE/lib"
	rm -rf "$tmp"
	trap - EXIT
	say "installed $CACHE/lib"
fi

# --- the release's source (headers for the declarations' check) -------------
if [ -f "$CACHE/src/include/llama.h" ] && [ -f "$CACHE/src/ggml/src/ggml-backend-impl.h" ]; then
	say "reusing $CACHE/src"
else
	command -v git >/dev/null || die "git is needed to open node-llama-cpp's source bundle"
	tmp="$(mktemp -d "$CACHE/fetch.XXXXXX")"
	trap 'rm -rf "$tmp"' EXIT
	say "fetching node-llama-cpp@$NLC_VERSION with npm pack (for llama/gitRelease.bundle)"
	(cd "$tmp" && npm pack --silent "node-llama-cpp@$NLC_VERSION" >/dev/null) || die "npm pack node-llama-cpp@$NLC_VERSION failed"
	tar -xzf "$tmp"/node-llama-cpp-*.tgz -C "$tmp" package/llama/gitRelease.bundle || die "no llama/gitRelease.bundle in node-llama-cpp"
	rm -rf "$CACHE/src"
	git clone -q "$tmp/package/llama/gitRelease.bundle" "$CACHE/src.tmp" 2>/dev/null || die "cannot clone the source bundle"
	mv "$CACHE/src.tmp" "$CACHE/src"
	rm -rf "$tmp"
	trap - EXIT
	say "installed $CACHE/src"
fi

# --- the model ---------------------------------------------------------------
if [ -n "$model" ]; then
	[ -f "$model" ] || die "no model at $model"
else
	model="$CACHE/tiny-llama-w3-seed1.gguf"
	if [ ! -f "$model" ]; then
		command -v go >/dev/null || die "go is needed to write the tiny model"
		say "writing $model (integrations/llamacpp/cmd/llamagguf, seed 1)"
		(cd "$ROOT/integrations/llamacpp" && GOWORK=off GOTOOLCHAIN="${GOTOOLCHAIN:-local}" go run ./cmd/llamagguf -seed 1 -o "$model") ||
			die "could not write the tiny model"
	fi
fi

# The GQA model (8 layers, GQA 4:1, head size 128, F16) with the tokenizer
# of the source bundle's vocabulary-only llama-spm file.
gqa="$CACHE/gqa-llama2-f16-seed1.gguf"
if [ ! -f "$gqa" ]; then
	command -v go >/dev/null || die "go is needed to write the GQA model"
	say "writing $gqa (integrations/llamacpp/cmd/llamagguf -vocab, seed 1)"
	(cd "$ROOT/integrations/llamacpp" && GOWORK=off GOTOOLCHAIN="${GOTOOLCHAIN:-local}" go run ./cmd/llamagguf -seed 1 \
		-vocab "$CACHE/src/models/ggml-vocab-llama-spm.gguf" -o "$gqa") || die "could not write the GQA model"
fi
q8="$CACHE/gqa-llama2-q8_0-seed1.gguf"
if [ ! -f "$q8" ]; then
	command -v go >/dev/null || die "go is needed to write the Q8_0 GQA model"
	say "writing $q8 (integrations/llamacpp/cmd/llamagguf -vocab -q8, seed 1)"
	(cd "$ROOT/integrations/llamacpp" && GOWORK=off GOTOOLCHAIN="${GOTOOLCHAIN:-local}" go run ./cmd/llamagguf -seed 1 -q8 \
		-vocab "$CACHE/src/models/ggml-vocab-llama-spm.gguf" -o "$q8") || die "could not write the Q8_0 GQA model"
fi

{
	echo "MEMGEN_LLAMACPP_LIB=$CACHE/lib/$LIBNAME"
	echo "MEMGEN_LLAMACPP_SRC=$CACHE/src"
	echo "MEMGEN_LLAMACPP_MODEL=$model"
	echo "MEMGEN_LLAMACPP_GQA_MODEL=$gqa"
	echo "MEMGEN_LLAMACPP_Q8_MODEL=$q8"
} >"$CACHE/env"
cat "$CACHE/env"
