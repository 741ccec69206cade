#!/usr/bin/env bash
# make plugin-check-table: memgen plugin-check on the broken plugins of
# mechanisms/plugin/testdata, one build per fault, and a Markdown table of
# what it printed: the variant, the first finding line (or the last line
# when there is none), the exit status and the seconds it took. It prints
# the table docs/cabi.md shows; every variant must exit 1, the working
# plugins 0, and plugin-check itself must never die (exit status 1 or 0 and
# its final line printed), or this script exits 1.
#
#   scripts/plugin-check-table.sh [extra plugin-check flags]
#
# Needs go and a C compiler (CC, default cc). Builds into a temporary
# directory, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
CC=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/memgen" ./cmd/memgen

# name|source|macro|expected exit status
variants=(
	"working: minimal.c|minimal.c||0"
	"working: refhost.c|refhost.c||0"
	"lying commit (success, nothing installed)|refhost.c|REFHOST_BAD_COMMIT|1"
	"lying decommit (success, nothing released)|refhost.c|REFHOST_BAD_DECOMMIT|1"
	"commit that never returns|refhost.c|REFHOST_HANG_COMMIT|1"
	"commit that marks granules without mapping them|refhost.c|REFHOST_UNMAPPED_COMMIT|1"
	"allocate writes 64 bytes past *out|refhost.c|REFHOST_OVERRUN_OUT|1"
	"copy writes 64 bytes past dst|refhost.c|REFHOST_OVERRUN_DST|1"
	"handle table without a lock|broken.c|BROKEN_LOCKLESS|1"
	"new object filed under a live (reused) id|broken.c|BROKEN_REUSED_ID|1"
	"allocation at another live allocation's address|refhost.c|REFHOST_OVERLAP|1"
	"free that leaves the memory mapped (leak)|broken.c|BROKEN_LEAKY_FREE|1"
)

echo "| variant | what plugin-check printed (first finding) | exit | seconds |"
echo "| --- | --- | --- | --- |"
bad=0
for v in "${variants[@]}"; do
	IFS='|' read -r name src macro want <<<"$v"
	lib="$tmp/lib${macro:-plain}_${src%.c}.so"
	"$CC" -std=c11 -O2 -fPIC -shared -pthread -Iinclude ${macro:+-D"$macro"} \
		-o "$lib" "mechanisms/plugin/testdata/$src"
	start=$(date +%s.%N)
	set +e
	"$tmp/memgen" plugin-check "$@" "$lib" >"$tmp/out" 2>&1
	code=$?
	set -e
	secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
	line=$(grep -m1 '^--- ' "$tmp/out" || tail -n1 "$tmp/out")
	line=${line//|/\\|}
	echo "| $name (\`${src}${macro:+ -D$macro}\`) | \`$line\` | $code | $secs |"
	last=$(tail -n1 "$tmp/out")
	if [[ $code != "$want" || ( $last != "memgen plugin-check: ok" && $last != "memgen plugin-check: FAIL"* ) ]]; then
		echo "plugin-check on $name: exit $code, want $want; last line: $last" >&2
		bad=1
	fi
done
exit $bad
