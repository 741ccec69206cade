#!/usr/bin/env bash
# bench-fakegen.sh — generation time of memgen's fakes vs counterfeiter's, in
# one run, alternating the two, on the same generated interfaces.
#
#   scripts/bench-fakegen.sh [rounds]      (default 15)
#
# memgen:        `memgen generate` into a scratch copy of the module: the whole
#                output (contract, checked wrappers, conformance suite, fakes,
#                docs), which is more than the fakes alone.
# counterfeiter: v6.14.0, built with `go run github.com/maxbrunsfeld/counterfeiter/v6@v6.14.0`
#                semantics but installed once into a scratch GOBIN (never into
#                go.mod), generating a fake for each of the contract's 9
#                interfaces (Mechanism, DeviceAllocator, VirtualBacking,
#                SharedMapping, Grant, Account, Fence, Stream, DeviceContext) in
#                one `counterfeiter -generate` process.
# Both are compiled binaries timed from process start to exit, so the ratio
# compares the generators, not `go run`'s build step. Prints each side's
# median and the ratio counterfeiter/memgen.
set -euo pipefail

rounds=${1:-15}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

module=$(awk '/^module /{print $2; exit}' "$root/go.mod")
contract=generated/memapi
ifaces="Mechanism DeviceAllocator VirtualBacking SharedMapping Grant Account Fence Stream DeviceContext"

echo "building memgen and counterfeiter v6.14.0 ..." >&2
(cd "$root" && go build -o "$tmp/memgen" ./cmd/memgen)
# The same module go run would use; installing it once keeps the timed part
# free of go run's compile-and-link step. -mod=mod and the scratch GOBIN keep
# the project's go.mod untouched.
(cd "$tmp" && GOBIN="$tmp/bin" GOFLAGS=-mod=mod go install github.com/maxbrunsfeld/counterfeiter/v6@v6.14.0)

# memgen's scratch module: go.mod and the spec.
mkdir -p "$tmp/mg/spec"
cp "$root/go.mod" "$tmp/mg/go.mod"
cp "$root/spec/"* "$tmp/mg/spec/"

# counterfeiter's scratch module: the generated contract (stdlib only) and
# one file of directives.
mkdir -p "$tmp/cf/$contract" "$tmp/cf/cfgen"
printf 'module %s\n\ngo 1.26\n' "$module" > "$tmp/cf/go.mod"
cp "$root/$contract/"*.go "$tmp/cf/$contract/"
rm -f "$tmp/cf/$contract/"*_test.go
{
	echo "package cfgen"
	echo
	for i in $ifaces; do
		echo "//counterfeiter:generate -o out/fake_$(echo "$i" | tr 'A-Z' 'a-z').go $module/$contract.$i"
	done
} > "$tmp/cf/cfgen/gen.go"

now() { date +%s%N; }
run_memgen() { "$tmp/memgen" generate -root "$tmp/mg" >/dev/null 2>&1; }
run_cf() { (cd "$tmp/cf/cfgen" && GOFLAGS=-mod=mod "$tmp/bin/counterfeiter" -q -generate >/dev/null 2>&1); }

run_memgen || { echo "memgen generate failed" >&2; "$tmp/memgen" generate -root "$tmp/mg"; exit 1; }
run_cf || { echo "counterfeiter failed" >&2; (cd "$tmp/cf/cfgen" && "$tmp/bin/counterfeiter" -generate); exit 1; }
nf=$(ls "$tmp/cf/cfgen/out" | wc -l)
mf=$(find "$tmp/mg/fakes" -name '*.go' | wc -l)

: > "$tmp/mg.ns"; : > "$tmp/cf.ns"
for ((r = 0; r < rounds; r++)); do
	t0=$(now); run_memgen; t1=$(now); run_cf; t2=$(now)
	echo $((t1 - t0)) >> "$tmp/mg.ns"
	echo $((t2 - t1)) >> "$tmp/cf.ns"
done
median() { sort -n "$1" | awk '{a[NR]=$1} END{print (NR%2)? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}'; }
mg=$(median "$tmp/mg.ns"); cf=$(median "$tmp/cf.ns")
printf 'machine: %s cores, %s\n' "$(nproc)" "$(uname -sr)"
printf 'rounds: %d (alternating)\n' "$rounds"
printf '%-44s %10.1f ms  (%d fake files)\n' "memgen generate (everything, incl. fakes)" "$(echo "$mg/1000000" | bc -l)" "$mf"
printf '%-44s %10.1f ms  (%d fakes)\n' "counterfeiter -generate (9 interfaces)" "$(echo "$cf/1000000" | bc -l)" "$nf"
printf 'ratio: %.2f x-vs-counterfeiter (counterfeiter time / memgen time)\n' "$(echo "$cf/$mg" | bc -l)"
