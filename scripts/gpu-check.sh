#!/usr/bin/env bash
# gpu-check.sh — the CUDA mechanism against a real GPU, in two halves.
#
#   scripts/gpu-check.sh build         here (needs Go, no GPU): builds the amd64
#                                      test binaries of mechanisms/cuda into .gpu/
#   scripts/gpu-check.sh run [quick]   on the GPU machine (needs the NVIDIA
#                                      driver, no Go): runs them against
#                                      libcuda.so.1; quick is the default and
#                                      ends within 315 s whatever hangs
#   scripts/gpu-check.sh run probes    the device and the probes alone: within 165 s
#   scripts/gpu-check.sh run full      longer benchmarks: within 585 s
#   scripts/gpu-check.sh all [mode]    both, on a machine with Go and a GPU
#
# The binaries are built with CGO_ENABLED=0 (purego needs no cgo, no C
# toolchain, no CUDA headers). They are NOT statically linked: purego's
# dlopen comes from the system's libc (ld-linux, libc.so.6), which every
# machine with the NVIDIA driver has; nothing else is needed there but
# coreutils' timeout. .gpu/ is git-ignored: copy it to the GPU machine with
# the tree.
#
# The run half, with MEMGEN_CUDA=real (the tests use the real driver and skip
# what needs the simulator's controls; TestMain keeps one primary context
# alive for the whole binary), in steps that are each bounded twice: the test
# binary's -test.timeout (which names the test that was running) and, 10 s
# later, timeout(1); and the whole run has a deadline that shortens the last
# steps when the first ones were slow:
#   1. the device (nvidia-smi, when present);
#   2. the probes (TestGPUProbe*): driver facts the simulator assumes, printed
#      as a table (fact | simulator | device | same or DIFFERS); a fact that
#      differs is reported, never failed;
#   3. the simulator's own tests (the binary runs there);
#   4. every other test of the package: the whole generated conformance suite,
#      bare and through checked.Wrap(verify), and the tests that run on a
#      real driver (shared handle at two addresses, the ledger against
#      cuMemGetInfo, copy errors at fences, context rules, allocation
#      requests, zeroing seen from a non-blocking stream; the ones that need
#      the simulator's controls skip);
#   5. short benchmarks (quick: 20 iterations, growth to 16 chunks; full:
#      200 and 64): cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap per
#      2 MiB chunk; growth through VMM vs cuMemAlloc-and-copy; pool vs none;
#      a growth step with spares vs today's path.
# It prints the benchmark table beside the published A100 figures, then the
# result: PASSED, or FAILED with one line per reason (the device did not
# open, the tests that failed by name, a step that ran out of time and the
# test it was running). Those are the console's last lines.
#
# Environment: OUT (full logs go to $OUT/gpu-check/ when set, else to a
# temporary folder that is printed), GPU_CHECK_DIR (binaries; default .gpu
# beside the repo, or the script's own folder when it was copied there),
# GPU_CHECK_BENCHTIME and GPU_CHECK_GROW_CHUNKS (override the mode's),
# GPU_CHECK_DRIVER=sim (rehearse the run half on the simulator, anywhere: its
# figures are host-memory figures, not GPU ones), MEMGEN_REHEARSE_HANG=NAME
# (the probe whose name contains NAME sleeps for an hour: only to rehearse
# the bounds).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
here=$(cd "$(dirname "$0")" && pwd)

build() {
	set -e
	cd "$root"
	mkdir -p .gpu
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go test -c -o .gpu/cuda.test ./mechanisms/cuda
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go test -c -o .gpu/cudasim.test ./mechanisms/cuda/cudasim
	cp scripts/gpu-check.sh .gpu/gpu-check.sh
	echo "built: $(ls .gpu | tr '\n' ' ')"
	set +e
}

reasons=()
fail() { reasons+=("$*"); }

# bounded NAME WANT LOG CMD...: runs CMD with its output in LOG, for at most
# WANT seconds (less when the run's deadline is nearer), and records why it
# failed. The command's own -test.timeout must be given as $tt (set here,
# WANT - 10 s, so the test binary names the running test before timeout(1)
# has to kill it).
budget=0
bounded() {
	local name=$1 want=$2 log=$3
	shift 3
	budget=$((deadline - SECONDS - 6))
	if [ "$budget" -gt "$want" ]; then budget=$want; fi
	if [ "$budget" -lt 15 ]; then
		fail "SKIPPED: $name: the run's deadline leaves ${budget} s"
		echo "   skipped: the deadline is near"
		: >"$log"
		return 1
	fi
	local tt=$((budget - 10)) t0=$SECONDS rc=0
	timeout -k 5 "$budget" "${@//@TT@/${tt}s}" >"$log" 2>&1 || rc=$?
	echo "   ($name: $((SECONDS - t0)) s, exit $rc, limit ${budget} s; log $log)"
	[ "$rc" -eq 0 ] && return 0
	diagnose "$name" "$rc" "$log"
	return 1
}

# diagnose NAME RC LOG turns a failed step's log into reasons.
diagnose() {
	local name=$1 rc=$2 log=$3 running
	if grep -q 'does not open:' "$log"; then
		fail "NO DEVICE: $name: $(grep -m1 'does not open:' "$log")"
	fi
	if grep -q '^panic: test timed out after' "$log"; then
		running=$(sed -n '/^[[:space:]]*running tests:/,/^[[:space:]]*$/p' "$log" | sed -n '2,4p' | sed 's/^[[:space:]]*//' | tr '\n' ' ' | sed 's/ *$//')
		fail "TIMEOUT: $name: $(grep -m1 '^panic: test timed out after' "$log" | sed 's/^panic: //'); running: ${running:-?}"
	elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
		running=$(grep -E '^=== (RUN|CONT)' "$log" | tail -n 1 | awk '{print $3}')
		fail "TIMEOUT: $name: killed after ${budget} s (timeout(1)); last test started: ${running:-?}"
	fi
	local failed
	failed=$(grep -E '^ *--- FAIL: ' "$log" | sed -E 's/^ *--- FAIL: ([^ ]+).*/\1/' | head -n 12 | tr '\n' ' ')
	if [ -n "$failed" ]; then
		fail "FAIL: $name: $failed"
	fi
	if [ "${#reasons[@]}" -eq "$nreasons" ]; then
		fail "FAIL: $name: exit $rc; last line: $(grep -v '^[[:space:]]*$' "$log" | tail -n 1)"
	fi
}

run() {
	mode=${1:-quick}
	case "$mode" in
	quick) benchtime=20x chunks=16 total=300 ;;
	probes) benchtime= chunks= total=150 ;;
	full) benchtime=200x chunks=64 total=570 ;;
	*) echo "unknown mode $mode (quick, probes or full)" >&2; exit 2 ;;
	esac
	start=$SECONDS
	deadline=$((start + total))
	benchtime=${GPU_CHECK_BENCHTIME:-$benchtime}
	chunks=${GPU_CHECK_GROW_CHUNKS:-$chunks}
	dir=${GPU_CHECK_DIR:-}
	if [ -z "$dir" ]; then
		if [ -x "$here/cuda.test" ]; then dir=$here; else dir=$root/.gpu; fi
	fi
	if [ -n "${OUT:-}" ]; then log=$OUT/gpu-check; else log=$(mktemp -d); fi
	mkdir -p "$log"
	if ! command -v timeout >/dev/null; then
		echo "== gpu-check: FAILED: no timeout(1) here (coreutils): the steps cannot be bounded"
		exit 2
	fi
	if [ ! -x "$dir/cuda.test" ] || [ ! -x "$dir/cudasim.test" ]; then
		echo "== gpu-check: FAILED: no $dir/cuda.test or cudasim.test: run '$0 build' first (and carry .gpu/ here)"
		exit 2
	fi
	short=()
	if [ "${GPU_CHECK_DRIVER:-real}" = sim ]; then
		echo "!! GPU_CHECK_DRIVER=sim: simulated driver, the figures below are NOT GPU figures"
		unset MEMGEN_CUDA
		short=(-test.short) # the suite at the simulator's 64 KiB granularity only, as a GPU runs it once
	else
		export MEMGEN_CUDA=real
	fi
	echo "== gpu-check $mode: logs in $log; ends within $((total + 15)) s"
	nreasons=0

	echo "== device"
	if command -v nvidia-smi >/dev/null; then
		timeout -k 2 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$log/device.txt" 2>&1 ||
			echo "   nvidia-smi failed or timed out: $(tail -n 1 "$log/device.txt")"
		cat "$log/device.txt"
	else
		echo "   no nvidia-smi"
	fi

	echo "== probes: driver facts the simulator assumes"
	nreasons=${#reasons[@]}
	bounded probes 50 "$log/probes.txt" "$dir/cuda.test" -test.count=1 -test.v -test.run '^TestGPUProbe' -test.timeout=@TT@
	awk -F ' [|] ' '/^GPU-PROBE/ { printf "%-72s | %-44s | %-44s | %s\n", $2, $3, $4, $5 }
		BEGIN { printf "%-72s | %-44s | %-44s | %s\n", "fact", "simulator", "device", "same?" }' "$log/probes.txt"
	differ=$(grep -c '^GPU-PROBE .*| DIFFERS$' "$log/probes.txt")
	facts=$(grep -c '^GPU-PROBE' "$log/probes.txt")
	echo "   probes: $facts facts recorded, $differ differ from the simulator"
	[ "$differ" -gt 0 ] && echo "   !! a fact differs: see the rows marked DIFFERS (reported, not failed)"
	if grep -q '^GPU-PROBE .*| no device$' "$log/probes.txt"; then
		fail "NO DEVICE: probes: $(grep -m1 '^GPU-PROBE .*| no device$' "$log/probes.txt" | awk -F ' [|] ' '{print $4}')"
	fi

	if [ "$mode" != probes ]; then
		echo "== simulator tests (sanity: the binary runs here)"
		nreasons=${#reasons[@]}
		bounded "simulator tests" 30 "$log/sim.txt" "$dir/cudasim.test" -test.count=1 -test.timeout=@TT@
		tail -n 1 "$log/sim.txt"

		echo "== every other test of the package: conformance (bare, checked) and the rest"
		nreasons=${#reasons[@]}
		bounded tests 130 "$log/tests.txt" "$dir/cuda.test" -test.count=1 -test.v -test.skip '^TestGPUProbe' -test.timeout=@TT@ "${short[@]}"
		grep -E '^(--- |FAIL|ok|PASS)' "$log/tests.txt" | grep -v -- '--- PASS: TestConformance/' || true
		grep -E 'ledger:|device [0-9]+:' "$log/tests.txt" | sed 's/^ *//' || true
		pass=$(grep -cE '^ *--- PASS' "$log/tests.txt")
		fail=$(grep -cE '^ *--- FAIL' "$log/tests.txt")
		skip=$(grep -cE '^ *--- SKIP' "$log/tests.txt")
		echo "   tests and subtests: $pass passed, $fail failed, $skip skipped"

		echo "== benchmarks (-test.benchtime=$benchtime, growth to $chunks chunks)"
		nreasons=${#reasons[@]}
		bench=70
		[ "$mode" = full ] && bench=300
		bounded benchmarks $bench "$log/bench.txt" "$dir/cuda.test" -test.run '^$' -test.bench 'VMMChunk|Growth|CommitChunk|GrowthStep' \
			-test.timeout=@TT@ -test.benchtime="$benchtime" -cuda.grow-chunks="$chunks"
		grep -E '^Benchmark' "$log/bench.txt"

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
		}' chunks="$chunks" "$log/bench.txt" >"$log/summary.txt"
		if grep -q '^Benchmark' "$log/bench.txt"; then cat "$log/summary.txt"; else echo "   no benchmark finished"; fi
	fi

	echo
	echo "== result ($mode, $((SECONDS - start)) s; logs: $log)"
	if [ "${#reasons[@]}" -eq 0 ]; then
		echo "gpu-check: PASSED"
		exit 0
	fi
	for r in "${reasons[@]}"; do echo "  $r"; done
	echo "gpu-check: FAILED (${#reasons[@]} reasons above)"
	exit 1
}

case "${1:-}" in
build) build ;;
run) run "${2:-quick}" ;;
all) build && run "${2:-quick}" ;;
*) sed -n '2,46p' "$0" >&2; exit 2 ;;
esac
