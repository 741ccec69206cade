#!/usr/bin/env bash
# report-screenshot.sh renders a memgen memory report (the self-contained
# HTML file memdemo --report writes, or any memreport output) in headless
# Chromium and saves a PNG screenshot of it.
#
#   scripts/report-screenshot.sh [REPORT.html] [OUT.png]
#
# Defaults: out/memory-report.html and out/memory-report.png. When the report
# does not exist it is made first with `go run ./cmd/memdemo --report ...`.
# Chromium is taken from $CHROMIUM, else chromium, chromium-browser or
# google-chrome on PATH; on Debian/Ubuntu, `apt-get install chromium`
# provides it. Nothing is fetched from the network while rendering: the
# report has no external scripts, styles or fonts.
set -euo pipefail

cd "$(dirname "$0")/.."
report="${1:-out/memory-report.html}"
out="${2:-${report%.html}.png}"

if [[ ! -f "$report" ]]; then
	echo "report-screenshot: $report does not exist; running the demo to make it" >&2
	mkdir -p "$(dirname "$report")"
	GOTOOLCHAIN=local go run ./cmd/memdemo --progress off --report "$report"
fi

browser="${CHROMIUM:-}"
if [[ -z "$browser" ]]; then
	for b in chromium chromium-browser google-chrome; do
		if command -v "$b" >/dev/null 2>&1; then
			browser="$b"
			break
		fi
	done
fi
if [[ -z "$browser" ]]; then
	echo "report-screenshot: no Chromium found (set CHROMIUM, or apt-get install chromium)" >&2
	exit 1
fi

profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
mkdir -p "$(dirname "$out")"
abs_out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
abs_report="$(cd "$(dirname "$report")" && pwd)/$(basename "$report")"
rm -f "$abs_out"

"$browser" --headless --no-sandbox --disable-gpu --no-first-run \
	--disable-background-networking --disable-component-update --disable-sync \
	--hide-scrollbars --user-data-dir="$profile" \
	--screenshot="$abs_out" --window-size=1400,900 \
	"file://$abs_report" >/dev/null 2>&1 || true

if [[ ! -s "$abs_out" ]]; then
	echo "report-screenshot: $browser wrote no screenshot" >&2
	exit 1
fi
echo "$out"
