#!/usr/bin/env bash
# report-screenshot.sh renders a memgen memory report (the self-contained
# HTML file memdemo --report writes, or any memreport output) in headless
# Chromium: screenshots at 1600 and 800 px wide and at 1280x800, and, with --check, the
# page's interactive state checked in the browser.
#
#   scripts/report-screenshot.sh [--install] [--check] [--view FRAGMENT] [REPORT.html] [OUT]
#
# It writes OUT.png (1600 px wide), OUT-800.png (800 px wide) and
# OUT-1280x800.png (what a 1280x800 screen shows before any scrolling); OUT
# defaults to the report's path without .html. --view 't0=100&t1=130&cursor=118'
# also writes OUT-view.png (1600 px) of the page opened on that view (the
# page's URL fragment: t0, t1, hide=HOLDER,..., cursor, kinds=KIND,...). When the report does not
# exist it is made first with `go run ./cmd/memdemo --compare --report ...`.
#
# --check also runs memreport's TestReportInChromium (a report loaded with a
# zoom, a holder switched off and a cursor in its URL fragment; the DOM the
# page's script made is checked at both widths) and loads this report with a
# zoom in its fragment and checks the dumped DOM. Without Chromium, --check
# prints a SKIP line and exits 0; plain screenshots exit 1.
#
# --install installs Chromium with apt-get when none is found (as root).
#
# Chromium is taken from $CHROMIUM, else chromium, chromium-browser or
# google-chrome on PATH. Nothing is fetched from the network while
# rendering: the report has no external scripts, styles or fonts.
set -euo pipefail

cd "$(dirname "$0")/.."
install=0
check=0
view=""
while [[ $# -gt 0 ]]; do
	case "$1" in
	--install) install=1; shift ;;
	--check) check=1; shift ;;
	--view) view="${2:?--view needs a fragment}"; shift 2 ;;
	--) shift; break ;;
	-*) echo "report-screenshot: unknown flag $1" >&2; exit 2 ;;
	*) break ;;
	esac
done
report="${1:-out/memory-report.html}"
out="${2:-${report%.html}}"
out="${out%.png}"

find_browser() {
	if [[ -n "${CHROMIUM:-}" ]]; then
		echo "$CHROMIUM"
		return
	fi
	for b in chromium chromium-browser google-chrome; do
		if command -v "$b" >/dev/null 2>&1; then
			command -v "$b"
			return
		fi
	done
}

browser="$(find_browser)"
if [[ -z "$browser" && $install == 1 ]]; then
	if command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
		echo "report-screenshot: installing chromium with apt-get" >&2
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >&2 || true
		browser="$(find_browser)"
	else
		echo "report-screenshot: --install needs apt-get and root" >&2
	fi
fi
if [[ -z "$browser" ]]; then
	if [[ $check == 1 ]]; then
		echo "report-screenshot: SKIP: no Chromium (set CHROMIUM, apt-get install -y chromium, or pass --install): the report was not checked in a browser"
		exit 0
	fi
	echo "report-screenshot: no Chromium found (set CHROMIUM, apt-get install -y chromium, or pass --install)" >&2
	exit 1
fi

if [[ ! -f "$report" ]]; then
	echo "report-screenshot: $report does not exist; running the demo to make it" >&2
	mkdir -p "$(dirname "$report")"
	GOTOOLCHAIN=local go run ./cmd/memdemo --progress off --compare --report "$report" >/dev/null
fi

profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
mkdir -p "$(dirname "$out")"
abs_out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
abs_report="$(cd "$(dirname "$report")" && pwd)/$(basename "$report")"

headless() {
	"$browser" --headless --no-sandbox --disable-gpu --no-first-run \
		--disable-background-networking --disable-component-update --disable-sync \
		--hide-scrollbars --user-data-dir="$profile" "$@" 2>/dev/null
}

shots=("1600 1300 $abs_out.png" "800 1700 $abs_out-800.png" "1280 800 $abs_out-1280x800.png")
if [[ -n "$view" ]]; then
	shots+=("1600 1000 $abs_out-view.png #$view")
fi
for shot in "${shots[@]}"; do
	read -r w h file frag <<<"$shot"
	rm -f "$file"
	headless --screenshot="$file" --window-size="$w,$h" "file://$abs_report${frag:-}" >/dev/null || true
	if [[ ! -s "$file" ]]; then
		echo "report-screenshot: $browser wrote no screenshot at $w px" >&2
		exit 1
	fi
	echo "$file"
done

if [[ $check == 1 ]]; then
	MEMREPORT_REQUIRE_CHROMIUM=1 CHROMIUM="$browser" GOTOOLCHAIN=local go test -count=1 -run TestReportInChromium ./memreport/
	# This report, zoomed on its first tenth: the script applied the view.
	dom="$(headless --dump-dom --window-size=800,1000 "file://$abs_report#t0=0&t1=10")"
	if ! grep -q 'data-t0="0" data-t1="10"' <<<"$dom" || ! grep -q 'class="timeline live"' <<<"$dom"; then
		echo "report-screenshot: FAIL: $report did not apply the zoom in its fragment" >&2
		exit 1
	fi
	echo "report-screenshot: $report checked in $browser: charts redrawn, zoom applied"
fi
