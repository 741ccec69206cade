#!/usr/bin/env bash
# gpu-check.sh — the CUDA mechanism against a real GPU, in two halves.
#
#   scripts/gpu-check.sh build        here (needs Go, no GPU): builds the amd64
#                                     test binaries of mechanisms/cuda into .gpu/
#   scripts/gpu-check.sh run [quick]  on the GPU machine (needs the NVIDIA
#                                     driver, no Go): runs them against
#                                     libcuda.so.1; quick is the default
#   scripts/gpu-check.sh run full     the same with longer benchmarks
#   scripts/gpu-check.sh all [mode]   both, on a machine with Go and a GPU
#
# The binaries are built with CGO_ENABLED=0 (purego needs no cgo, no C
# toolchain, no CUDA headers). They are NOT statically linked: purego's
# dlopen comes from the system's libc (ld-linux, libc.so.6), which every
# machine with the NVIDIA driver has; nothing else is needed there.
# .gpu/ is git-ignored: copy it to the GPU machine with the tree.
#
# The run half, with MEMGEN_CUDA=real (the tests use the real driver and skip
# what needs the simulator's controls; TestMain keeps one primary context
# alive for the whole binary):
#   1. the simulator's own tests (the binary runs there);
#   2. every test of the package: the whole generated conformance suite,
#      bare and through checked.Wrap(verify), and the tests that run on a
#      real driver (shared handle at two addresses, the ledger against
#      cuMemGetInfo, copy errors at fences, context rules, allocation
#      requests; the ones that need the simulator's controls skip);
#   3. short benchmarks (quick: 20 iterations, growth to 16 chunks; full:
#      200 and 64): cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap per
#      2 MiB chunk; growth through VMM vs cuMemAlloc-and-copy; pool vs none;
#      a growth step with spares vs today's path.
# It prints a short table last, beside the published A100 figures.
#
# Environment: OUT (full logs go to $OUT/gpu-check/ when set, else to a
# temporary folder that is printed), GPU_CHECK_DIR (binaries; default .gpu
# beside the repo, or the script's own folder when it was copied there),
# GPU_CHECK_BENCHTIME and GPU_CHECK_GROW_CHUNKS (override the mode's),
# GPU_CHECK_DRIVER=sim (rehearse the run half on the simulator, anywhere: its
# figures are host-memory figures, not GPU ones).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
here=$(cd "$(dirname "$0")" && pwd)

build() {
	cd "$root"
	mkdir -p .gpu
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go test -c -o .gpu/cuda.test ./mechanisms/cuda
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go test -c -o .gpu/cudasim.test ./mechanisms/cuda/cudasim
	cp scripts/gpu-check.sh .gpu/gpu-check.sh
	echo "built: $(ls .gpu | tr '\n' ' ')"
}

run() {
	mode=${1:-quick}
	case "$mode" in
	quick) benchtime=20x chunks=16 ;;
	full) benchtime=200x chunks=64 ;;
	*) echo "unknown mode $mode (quick or full)" >&2; exit 2 ;;
	esac
	benchtime=${GPU_CHECK_BENCHTIME:-$benchtime}
	chunks=${GPU_CHECK_GROW_CHUNKS:-$chunks}
	dir=${GPU_CHECK_DIR:-}
	if [ -z "$dir" ]; then
		if [ -x "$here/cuda.test" ]; then dir=$here; else dir=$root/.gpu; fi
	fi
	[ -x "$dir/cuda.test" ] || { echo "no $dir/cuda.test: run '$0 build' first (and copy .gpu/ here)" >&2; exit 2; }
	if [ -n "${OUT:-}" ]; then log=$OUT/gpu-check; else log=$(mktemp -d); fi
	mkdir -p "$log"
	short=()
	if [ "${GPU_CHECK_DRIVER:-real}" = sim ]; then
		echo "!! GPU_CHECK_DRIVER=sim: simulated driver, the figures below are NOT GPU figures"
		unset MEMGEN_CUDA
		short=(-test.short) # the suite at the simulator's 64 KiB granularity only, as a GPU runs it once
	else
		export MEMGEN_CUDA=real
	fi
	start=$SECONDS
	echo "== gpu-check $mode: logs in $log"
	echo "== device"
	if command -v nvidia-smi >/dev/null; then
		nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$log/device.txt" || true
	fi

	status=0
	echo "== simulator tests (sanity: the binary runs here)"
	"$dir/cudasim.test" -test.count=1 >"$log/sim.txt" 2>&1 || status=1
	tail -n 1 "$log/sim.txt"

	echo "== every test of the package: conformance (bare, checked) and the rest"
	"$dir/cuda.test" -test.count=1 -test.v -test.timeout=5m "${short[@]}" >"$log/tests.txt" 2>&1 || status=1
	grep -E '^(--- |FAIL|ok|PASS)' "$log/tests.txt" | grep -v -- '--- PASS: TestConformance/' || true
	grep -E 'ledger:|device [0-9]+:' "$log/tests.txt" | sed 's/^ *//' || true
	pass=$(grep -cE '^ +--- PASS' "$log/tests.txt" || true)
	fail=$(grep -cE '^ *--- FAIL' "$log/tests.txt" || true)
	echo "subtests: $pass passed, $fail failed (full log: $log/tests.txt)"

	echo "== benchmarks (-test.benchtime=$benchtime, growth to $chunks chunks)"
	"$dir/cuda.test" -test.run '^$' -test.bench 'VMMChunk|Growth|CommitChunk|GrowthStep' -test.timeout=5m \
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
	/^BenchmarkGrowth-|^BenchmarkGrowth / { v = metric("vmm-us/grow"); ac = metric("alloccopy-us/grow"); x = metric("x-vs-alloccopy") }
	/^BenchmarkCommitChunk/ { p = metric("pool-us/cycle"); np = metric("nopool-us/cycle"); px = metric("x-vs-nopool") }
	/^BenchmarkGrowthStep/ { ss = metric("spares-us/step"); ts = metric("today-us/step"); sx = metric("x-vs-today") }
	END {
		printf "%-22s %12s %12s %8s\n", "call", "measured", "A100", "ratio"
		row("cuMemCreate", c, 193); row("cuMemMap", m, 1.45); row("cuMemSetAccess", s, 36); row("cuMemUnmap", u, 26)
		row("cuMemAlloc (baseline)", a, "")
		printf "growth to %s chunks: VMM %s us, alloc+copy %s us, alloc+copy/VMM = %sx\n", chunks, v, ac, x
		printf "commit+decommit 1 chunk: pool %s us, no pool %s us, no-pool/pool = %sx\n", p, np, px
		printf "growth step of 2 MiB: spares %s us, today %s us, spares/today = %sx\n", ss, ts, sx
	}
	function row(name, got, ref) {
		if (ref == "") printf "%-22s %12s %12s %8s\n", name, got, "-", "-"
		else if (got == "") printf "%-22s %12s %12s %8s\n", name, "n/a", ref, "-"
		else printf "%-22s %12s %12s %8.2f\n", name, got, ref, got / ref
	}' chunks="$chunks" "$log/bench.txt" | tee "$log/summary.txt"
	echo "== done in $((SECONDS - start)) s, status $status; logs: $log"
	exit $status
}

case "${1:-}" in
build) build ;;
run) run "${2:-quick}" ;;
all) build && run "${2:-quick}" ;;
*) sed -n '2,36p' "$0" >&2; exit 2 ;;
esac
