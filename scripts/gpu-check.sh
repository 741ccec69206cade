#!/usr/bin/env bash
# gpu-check.sh — the CUDA mechanism against a real GPU, in two halves.
#
#   scripts/gpu-check.sh build   here (needs Go, no GPU): builds the static
#                                amd64 test binaries of mechanisms/cuda into .gpu/
#   scripts/gpu-check.sh run     on a GPU machine (needs the NVIDIA driver,
#                                no Go): runs them against libcuda.so.1
#   scripts/gpu-check.sh all     both, on a machine that has Go and a GPU
#
# The run half, with MEMGEN_CUDA=real (the tests use the real driver instead
# of the simulator, and skip what needs the simulator's controls):
#   1. the generated conformance suite, bare and through checked.Wrap(verify);
#   2. TestSharedHandleTwoAddresses: one physical handle mapped at two
#      addresses shows the same bytes, and a read-only view refuses writes;
#   3. TestRealDriverLedger: device free memory vs UsedBytes around a commit;
#   4. micro-benchmarks: cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap per
#      2 MiB chunk; growth through VMM vs cuMemAlloc-and-copy; pool vs none.
# It prints a short table last, beside the published A100 figures.
#
# Environment: GPU_CHECK_DIR (binaries; default .gpu beside the repo, or the
# script's own folder when it was copied there), GPU_CHECK_BENCHTIME
# (default 200x), GPU_CHECK_GROW_CHUNKS (default 64 chunks = 128 MiB),
# GPU_CHECK_DRIVER=sim (rehearse the run half on the simulator, anywhere:
# its figures are host-memory figures, not GPU ones).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
here=$(cd "$(dirname "$0")" && pwd)

build() {
	cd "$root"
	mkdir -p .gpu
	# CGO_ENABLED=0 (purego needs no cgo): no C toolchain, no CUDA headers. The
	# binaries still import dlopen from the system's libc/libdl (purego's
	# fakecgo), which every machine with the NVIDIA driver has.
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go test -c -o .gpu/cuda.test ./mechanisms/cuda
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go test -c -o .gpu/cudasim.test ./mechanisms/cuda/cudasim
	cp scripts/gpu-check.sh .gpu/gpu-check.sh
	echo "built: $(ls .gpu | tr '\n' ' ')"
}

run() {
	dir=${GPU_CHECK_DIR:-}
	if [ -z "$dir" ]; then
		if [ -x "$here/cuda.test" ]; then dir=$here; else dir=$root/.gpu; fi
	fi
	[ -x "$dir/cuda.test" ] || { echo "no $dir/cuda.test: run '$0 build' first" >&2; exit 2; }
	benchtime=${GPU_CHECK_BENCHTIME:-200x}
	chunks=${GPU_CHECK_GROW_CHUNKS:-64}
	log=$(mktemp -d)
	if [ "${GPU_CHECK_DRIVER:-real}" = sim ]; then
		echo "!! GPU_CHECK_DRIVER=sim: simulated driver, the figures below are NOT GPU figures"
		unset MEMGEN_CUDA
	else
		export MEMGEN_CUDA=real
	fi

	echo "== device"
	if command -v nvidia-smi >/dev/null; then
		nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
	fi

	status=0
	echo "== simulator rules (sanity: the binary runs here)"
	"$dir/cudasim.test" -test.count=1 >"$log/sim.txt" 2>&1 || status=1
	tail -n 1 "$log/sim.txt"

	echo "== conformance, shared handle, ledger (real driver)"
	"$dir/cuda.test" -test.count=1 -test.v -test.timeout=9m \
		-test.run 'TestConformance$|TestSharedHandleTwoAddresses|TestRealDriverLedger|TestCopyErrorReachesFence|TestContextRules|TestAllocateRequests' \
		>"$log/tests.txt" 2>&1 || status=1
	grep -E '^(--- |FAIL|ok|PASS)' "$log/tests.txt" | grep -v -- '--- PASS: TestConformance/' || true
	grep -E 'ledger:|device [0-9]+:' "$log/tests.txt" | sed 's/^ *//' || true
	pass=$(grep -cE '^ +--- PASS' "$log/tests.txt" || true)
	fail=$(grep -cE '^ *--- FAIL' "$log/tests.txt" || true)
	echo "subtests: $pass passed, $fail failed (full log: $log/tests.txt)"

	echo "== benchmarks (-test.benchtime=$benchtime, growth to $chunks chunks)"
	"$dir/cuda.test" -test.run '^$' -test.bench 'VMMChunk|Growth|CommitChunk' \
		-test.benchtime="$benchtime" -cuda.grow-chunks="$chunks" >"$log/bench.txt" 2>&1 || status=1
	grep -E '^Benchmark' "$log/bench.txt" || cat "$log/bench.txt"

	echo
	echo "== summary (µs per 2 MiB chunk; A100 figures as published)"
	awk '
	function metric(name,   i) { for (i = 3; i < NF; i++) if ($(i+1) == name) return $i; return "" }
	/^BenchmarkVMMChunk/ {
		c = metric("create-us/chunk"); m = metric("map-us/chunk"); s = metric("setaccess-us/chunk"); u = metric("unmap-us/chunk")
		a = metric("memalloc-us/chunk")
	}
	/^BenchmarkGrowth/ { v = metric("vmm-us/grow"); ac = metric("alloccopy-us/grow"); x = metric("x-vs-alloccopy") }
	/^BenchmarkCommitChunk/ { p = metric("pool-us/cycle"); np = metric("nopool-us/cycle"); px = metric("x-vs-nopool") }
	END {
		printf "%-22s %12s %12s %8s\n", "call", "measured", "A100", "ratio"
		row("cuMemCreate", c, 193); row("cuMemMap", m, 1.45); row("cuMemSetAccess", s, 36); row("cuMemUnmap", u, 26)
		row("cuMemAlloc (baseline)", a, "")
		printf "growth to %s chunks: VMM %s us, alloc+copy %s us, alloc+copy/VMM = %sx\n", chunks, v, ac, x
		printf "commit+decommit 1 chunk: pool %s us, no pool %s us, no-pool/pool = %sx\n", p, np, px
	}
	function row(name, got, ref) {
		if (ref == "") printf "%-22s %12s %12s %8s\n", name, got, "-", "-"
		else if (got == "") printf "%-22s %12s %12s %8s\n", name, "n/a", ref, "-"
		else printf "%-22s %12s %12s %8.2f\n", name, got, ref, got / ref
	}' chunks="$chunks" "$log/bench.txt"
	exit $status
}

case "${1:-}" in
build) build ;;
run) run ;;
all) build && run ;;
*) sed -n '2,22p' "$0" >&2; exit 2 ;;
esac
