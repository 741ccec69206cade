#!/usr/bin/env bash
# The HTTP endpoint driven with curl: builds cmd/llamaserve, serves the GQA
# model (a real vocabulary and chat template) on a free local port with
# one sequence and a queue timeout of 300 ms, and checks a completion, a
# streamed completion, a chat completion, a 400, a 429 (while a long
# request holds the one sequence), /v1/models, /health and /metrics, then
# stops the server with SIGTERM. Each request and its answer is printed.
# It needs the environment scripts/llamacpp.sh writes (its "curl" mode
# runs this with it; make llamacpp-curl).
set -euo pipefail

: "${MEMGEN_LLAMACPP_LIB:?run scripts/llamacpp.sh first}"
: "${MEMGEN_LLAMACPP_GQA_MODEL:?run scripts/llamacpp.sh first}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
say() { printf 'llamaserve-curl.sh: %s\n' "$*" >&2; }
die() { say "FAIL: $*"; exit 1; }

if ! command -v curl >/dev/null; then
	say "installing curl"
	if [ "$(id -u)" = 0 ]; then apt-get install -y -qq curl >/dev/null; else sudo apt-get install -y -qq curl >/dev/null; fi
fi

tmp="$(mktemp -d)"
pid=""
cleanup() {
	[ -z "$pid" ] || kill "$pid" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

(cd "$ROOT/integrations/llamacpp" && GOWORK=off go build -o "$tmp/llamaserve" ./cmd/llamaserve)
"$tmp/llamaserve" -lib "$MEMGEN_LLAMACPP_LIB" -model "$MEMGEN_LLAMACPP_GQA_MODEL" -listen 127.0.0.1:0 \
	-sequences 1 -nctx 512 -budget 64MiB -queue 300ms 2>"$tmp/log" &
pid=$!
for _ in $(seq 200); do
	grep -q 'serving .* on http://' "$tmp/log" && break
	kill -0 "$pid" 2>/dev/null || { cat "$tmp/log" >&2; die "llamaserve exited"; }
	sleep 0.05
done
url="$(sed -n 's|.* on \(http://[0-9.:]*\).*|\1|p' "$tmp/log" | head -1)"
[ -n "$url" ] || { cat "$tmp/log" >&2; die "llamaserve did not start"; }
say "serving on $url"

# request METHOD PATH [BODY]: prints the exchange, leaves the status in
# $code, the headers in $tmp/h and the body in $tmp/b.
request() {
	local args=(-s -o "$tmp/b" -D "$tmp/h" -w '%{http_code}' -X "$1" "$url$2")
	[ $# -lt 3 ] || args+=(-H 'Content-Type: application/json' -d "$3")
	printf '$ curl -X %s %s%s\n' "$1" "$2" "${3:+ -d '$3'}"
	code="$(curl "${args[@]}")"
	printf '%s %s\n\n' "$code" "$(head -c 600 "$tmp/b")"
}

request GET /health
[ "$code" = 200 ] || die "/health: $code"
request GET /v1/models
[ "$code" = 200 ] && grep -q '"object":"list"' "$tmp/b" || die "/v1/models"
request POST /v1/completions '{"prompt": "The ledger is", "max_tokens": 8}'
[ "$code" = 200 ] && grep -q '"finish_reason":"length"' "$tmp/b" && grep -q '"completion_tokens":8' "$tmp/b" || die "completion"
request POST /v1/chat/completions '{"messages": [{"role": "user", "content": "Hello?"}], "max_tokens": 6, "temperature": 0.7, "seed": 1}'
[ "$code" = 200 ] && grep -q '"role":"assistant"' "$tmp/b" || die "chat completion"
printf '$ curl -N -X POST /v1/completions -d %s\n' "'{\"prompt\": \"The ledger is\", \"max_tokens\": 4, \"stream\": true}'"
curl -sN -X POST "$url/v1/completions" -H 'Content-Type: application/json' \
	-d '{"prompt": "The ledger is", "max_tokens": 4, "stream": true}' | tee "$tmp/s"
echo
[ "$(grep -c '^data: {' "$tmp/s")" = 5 ] && grep -q '^data: \[DONE\]' "$tmp/s" || die "streamed completion: 4 tokens, an end and [DONE]"
request POST /v1/completions '{"prompt": "x", "max_tokens": 0}'
[ "$code" = 400 ] && grep -q '"param":"max_tokens"' "$tmp/b" || die "400"
# A long request holds the only sequence; the next waits 300 ms: 429.
curl -s -o /dev/null -X POST "$url/v1/completions" -H 'Content-Type: application/json' -d '{"prompt": [1, 2, 3], "max_tokens": 480}' &
long=$!
sleep 0.3
request POST /v1/completions '{"prompt": [1, 2, 3], "max_tokens": 4}'
[ "$code" = 429 ] && grep -qi '^retry-after:' "$tmp/h" && grep -q '"type":"rate_limit_exceeded"' "$tmp/b" || die "429"
wait "$long"
request GET /metrics
[ "$code" = 200 ] && grep -q '^memgen_governor_' "$tmp/b" || die "/metrics"
grep '^memgen_governor_authority_charged_bytes\|^memgen_governor_.*charged' "$tmp/b" | head -3

kill -TERM "$pid"
wait "$pid" || die "llamaserve exited with status $? on SIGTERM"
pid=""
say "ok: completion, stream, chat, 400, 429, models, health, metrics; llamaserve stopped cleanly"
