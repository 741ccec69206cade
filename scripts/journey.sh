#!/usr/bin/env bash
# journey.sh walks the path of a new adopter, timing each step, on a copy of
# this checkout in a temporary directory (nothing here is touched):
#
#   1. a fresh downstream module (the go.mod lines the README gives) whose
#      test uses memgentest, with a buffer left open: go test fails, and the
#      report names the size, holder, role and file:line of the allocation;
#   2. the leak fixed: go test passes;
#   3. memgen new mechanism arena: the spec entry, the starting point, the
#      glue; go vet and memgen check pass at once;
#   4. go test of the new package fails, naming each method not written;
#   5. the methods written (the worked example's, copied in with the package
#      renamed: the stand-in for an author's own code); go test passes the
#      conformance suite and memgen check passes;
#   6. memctl operates a shared ledger: create, show, set-capacity applied,
#      a stale revision refused (exit 3, naming the current revision), show.
#
# Each step prints its time and what it checked; a step that does not
# behave as described fails the script. The last line sums it up:
#
#   journey: steps=6 ok=6 total=Ns (leak=...s new=...s ...)
#
# Times include the go command's builds: run it once to warm the build
# cache, then again for the warm figures.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local GOFLAGS=-mod=mod GOWORK=off

root="$(pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

steps=0
ok=0
summary=""
t_start=0
begin() {
	steps=$((steps + 1))
	echo "== step $steps: $1"
	t_start=$(date +%s.%N)
}
end() { # name
	local t
	t=$(awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
	ok=$((ok + 1))
	summary="$summary $1=${t}s"
	echo "   ok in ${t}s"
}
fail() {
	echo "journey: FAIL at step $steps: $*" >&2
	exit 1
}
expect() { # file pattern...
	local f="$1"
	shift
	for p in "$@"; do
		grep -q -- "$p" "$f" || { cat "$f" >&2; fail "the output lacks \"$p\""; }
	done
}

t0=$(date +%s.%N)

# 1. A downstream module with a leak.
begin "a downstream module using memgentest catches a leak with its line"
down="$work/downstream"
mkdir -p "$down"
cat >"$down/go.mod" <<EOF
module example.com/downstream

go 1.26.0

require github.com/memgen/memgen v0.0.0

replace github.com/memgen/memgen => $root
EOF
cp go.sum "$down/go.sum"
cat >"$down/cache_test.go" <<'EOF'
package downstream

import (
	"context"
	"testing"

	"github.com/memgen/memgen/memgentest"
)

func TestCache(t *testing.T) {
	h := memgentest.New(t, memgentest.Options{})
	b := h.Bind("kv", "cache")
	buf, err := b.Allocate(context.Background(), 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	_ = buf // left open: the leak
}
EOF
(cd "$down" && go mod tidy >/dev/null 2>&1 && go test -count=1 . >"$work/leak.txt" 2>&1) && fail "go test passed with a buffer left open"
expect "$work/leak.txt" "65536 bytes" "cache_test.go:13" "kv"
grep -m1 "made at" "$work/leak.txt" | sed 's/^[[:space:]]*/   /'
end leak

# 2. The leak fixed.
begin "the leak fixed: the downstream test passes"
sed -i 's#_ = buf // left open: the leak#if err := buf.Close(); err != nil {\n\t\tt.Fatal(err)\n\t}#' "$down/cache_test.go"
(cd "$down" && go test -count=1 . >"$work/fixed.txt" 2>&1) || { cat "$work/fixed.txt" >&2; fail "go test failed after the fix"; }
end fixed

# 3. A new mechanism.
begin "memgen new mechanism arena: spec entry, starting point, glue"
repo="$work/memgen"
mkdir -p "$repo"
git -C "$root" ls-files -z --cached --others --exclude-standard | (cd "$root" && tar --null -T - -cf -) | tar -C "$repo" -xf -
(cd "$repo" && go run ./cmd/memgen new mechanism arena -offers DeviceAllocator,VirtualBacking,SharedMapping -doc "Host memory from the Go heap, added by the journey." >"$work/new.txt" 2>&1) || { cat "$work/new.txt" >&2; fail "memgen new failed"; }
expect "$work/new.txt" "memgen new: mechanism arena: added to spec/capabilities.yaml"
(cd "$repo" && go vet ./mechanisms/arena/ && go run ./cmd/memgen check >"$work/check1.txt" 2>&1) || { cat "$work/check1.txt" >&2; fail "the starting point does not vet or check"; }
end new

# 4. Its conformance test names what is not written.
begin "go test of the starting point fails, naming each method not written"
(cd "$repo" && go test -count=1 ./mechanisms/arena/ >"$work/unwritten.txt" 2>&1) && fail "the starting point passed conformance"
expect "$work/unwritten.txt" "write DeviceAllocator.Allocate in mechanisms/arena/mechanism.go" \
	"write VirtualBacking.Reserve in mechanisms/arena/virtualbacking.go" "write DeviceContext.NewStream in mechanisms/arena/context.go"
echo "   $(grep -c -- '--- FAIL' "$work/unwritten.txt") failing subtests, e.g.: $(grep -m1 -o 'write [A-Za-z.]* in mechanisms/arena/[a-z]*\.go' "$work/unwritten.txt")"
end unwritten

# 5. Written: the conformance suite passes.
begin "the methods written: go test passes the conformance suite, memgen check passes"
for f in mechanism.go virtualbacking.go sharedmapping.go context.go; do
	sed 's/^package example$/package arena/' "mechanisms/example/$f" >"$repo/mechanisms/arena/$f"
done
(cd "$repo" && go test -count=1 -v -run TestConformance ./mechanisms/arena/ >"$work/written.txt" 2>&1) || { tail -40 "$work/written.txt" >&2; fail "conformance failed once written"; }
expect "$work/written.txt" "^ok" "PASS: TestConformance/checked/spec/name"
echo "   $(grep -c -- '--- PASS' "$work/written.txt") subtests passed, $(grep -c -- '--- SKIP' "$work/written.txt" || true) skipped, 0 failed"
(cd "$repo" && go run ./cmd/memgen check >"$work/check2.txt" 2>&1) || { cat "$work/check2.txt" >&2; fail "memgen check failed once written"; }
end written

# 6. memctl on a shared ledger.
begin "memctl operates a shared ledger"
ledger="$work/ledger"
go build -o "$work/memctl" ./cmd/memctl
memctl() { "$work/memctl" "$@"; }
memctl create "$ledger" 1GiB 8 >"$work/ctl.txt"
memctl show "$ledger" >>"$work/ctl.txt"
memctl set-capacity "$ledger" 512MiB 1 >>"$work/ctl.txt"
rc=0
memctl set-capacity "$ledger" 256MiB 1 >>"$work/ctl.txt" 2>&1 || rc=$?
[[ $rc == 3 ]] || fail "a stale revision exited $rc, want 3"
memctl show "$ledger" >>"$work/ctl.txt"
expect "$work/ctl.txt" "applied" "refused" "the ledger is at revision 2" "capacity 512MiB"
sed 's/^/   /' "$work/ctl.txt" | head -20
end memctl

total=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
echo "journey: steps=$steps ok=$ok total=${total}s ($(echo "$summary" | sed 's/^ //'))"
