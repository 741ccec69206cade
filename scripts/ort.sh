#!/usr/bin/env bash
# make ort: fetch what integrations/ort needs, outside the repository.
#
#   - ONNX Runtime 1.30.0's libonnxruntime.so.1 for linux/x64, taken from the
#     npm package onnxruntime-node@1.30.0 (package/bin/napi-v6/linux/x64/),
#     cached in $MEMGEN_ORT_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/memgen/ort-1.30.0)
#     and reused when present; its version string is checked through the C
#     API (OrtGetApiBase()->GetVersionString()).
#   - The ONNX project's conformance models: Debian's libonnx-testdata
#     (/usr/share/libonnx-testdata/data/), and python3-onnx to build the
#     pressure test's MLP (4 layers of width 512, 1 MiB) and the allocation
#     benchmark's fan-out model (128 branches, 2.1 MiB) and the decoder
#     (4 layers, GroupQueryAttention with 2 KV heads, one cache tensor per
#     KV head, 4,096 rows; 14 MB) into the cache, and three decoders in
#     the layouts ONNX Runtime GenAI's model builder and Hugging Face
#     Optimum export (see exported below; 9 MB each), and a benchmark-size
#     decoder in GenAI's layout (4 layers of width 1,024, 50M parameters;
#     202 MB, built in seconds).
#   - For `bench` only: the benchmark's MLP (24 layers of width 2048,
#     403 MB), built once into the cache.
#
# It prints the environment the tests read (MEMGEN_ORT_LIB,
# MEMGEN_ONNX_TESTDATA, MEMGEN_ORT_SMALL_MODEL, MEMGEN_ORT_FAN_MODEL,
# MEMGEN_ORT_DECODER_MODEL, MEMGEN_ORT_GENAI_MASK_MODEL,
# MEMGEN_ORT_GENAI_SEQLENS_MODEL, MEMGEN_ORT_OPTIMUM_MODEL,
# MEMGEN_ORT_GENAI_BENCH_MODEL, and MEMGEN_ORT_BENCH_MODEL once built) and
# writes it to $MEMGEN_ORT_CACHE/env. Exit status 0 means everything is in
# place; anything else means it could not be fetched.
#
#   scripts/ort.sh          fetch (make ort)
#   scripts/ort.sh fetch-bench
#                           fetch, and build the benchmark model too
#   scripts/ort.sh test     fetch, then vet and test integrations/ort under
#                           -race (make ort-test) with MEMGEN_ORT_REQUIRE=1,
#                           so that the tests really run. When the fetch
#                           fails it prints a SKIP line and exits 0, except
#                           under CI (CI=true) or MEMGEN_ORT_REQUIRE=1,
#                           where it prints FAIL and exits 1.
#   scripts/ort.sh bench    fetch and build the benchmark model, then the
#                           module's benchmarks (make ort-bench;
#                           ORT_BENCHTIME for the MLP inference, default 10x;
#                           ORT_FAN_BENCHTIME for the fan-out inference,
#                           default 20x; ORT_ALLOC_BENCHTIME for Alloc+Free,
#                           default 20000x; BenchmarkDecode, 2,048 tokens
#                           three ways, ORT_DECODE_BENCHTIME, default 1x;
#                           ORT_BENCHCOUNT runs of the last three, default 3;
#                           then BenchmarkPrefill and BenchmarkBatchDecode,
#                           ORT_BENCHCOUNT runs)
#   scripts/ort.sh long     fetch, then the exported layouts' greedy tokens
#                           and logits against ONNX Runtime's own run of each
#                           file over 2,048 steps (make ort-long; 4 minutes
#                           on a 2-core machine, the benchmark-size decoder's
#                           cases most of it; the regular test run takes 128)
#
# The module is built with GOWORK=off: against its own go.mod and go.sum,
# as `go mod tidy` and a module that depends on it see it (its replace
# directive points at this checkout, as go.work does).
set -euo pipefail

ORT_VERSION=1.30.0
CACHE="${MEMGEN_ORT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/memgen/ort-$ORT_VERSION}"
TESTDATA="${MEMGEN_ONNX_TESTDATA:-/usr/share/libonnx-testdata/data}"
LIB="$CACHE/libonnxruntime.so.1"
MODEL="$CACHE/mlp24x2048b64.onnx"
SMALL="$CACHE/mlp4x512b256.onnx"
FAN="$CACHE/fan128dyn.onnx"
DECODER="$CACHE/gqa-decoder-l4d256h4kv2s4096v1024.onnx"
GENAI_MASK="$CACHE/genai-mask-l2d256h4kv2p4096v1024.onnx"
GENAI_SEQLENS="$CACHE/genai-seqlens-l2d256h4kv2p4096v1024.onnx"
OPTIMUM="$CACHE/optimum-l2d256h4kv2p4096v1024.onnx"
GENAI_BENCH="$CACHE/genai-mask-l4d1024h16kv4f2816p2048v8192.onnx"

say() { printf 'ort.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

mode="${1:-fetch}"
case "$mode" in
fetch | fetch-bench) ;;
test | bench | long)
	fetch=fetch
	[ "$mode" = bench ] && fetch=fetch-bench
	if ! "$0" "$fetch" >/dev/null; then
		what="ONNX Runtime $ORT_VERSION or the ONNX conformance models could not be fetched (see above)"
		if [ "${CI:-}" = true ] || [ "${MEMGEN_ORT_REQUIRE:-}" = 1 ]; then
			echo "FAIL: integrations/ort: $what; CI=true or MEMGEN_ORT_REQUIRE=1 requires its tests to run"
			exit 1
		fi
		echo "SKIP: integrations/ort: $what; its tests did not run"
		exit 0
	fi
	while IFS='=' read -r k v; do export "$k=$v"; done <"$CACHE/env"
	export MEMGEN_ORT_REQUIRE=1 GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOWORK=off
	cd "$(dirname "$0")/../integrations/ort"
	if [ "$mode" = test ]; then
		go vet ./...
		bad="$(gofmt -l .)"
		[ -z "$bad" ] || { echo "gofmt needed on:"; echo "$bad"; exit 1; }
		# ORT_TEST_TIMEOUT bounds the run (go test's -timeout, reported as
		# "panic: test timed out" with every stack), within CI's 90 minutes.
		# The resident-set bounds are checked without the race detector
		# (its shadow memory grows with the process): one test, built
		# without -race, before the whole suite with it.
		go test -count=1 -run '^TestDecoderLedgerMatchesProcess$' .
		exec go test -race -count=1 -timeout "${ORT_TEST_TIMEOUT:-30m}" ./...
	fi
	if [ "$mode" = long ]; then
		exec go test -count=1 -run '^TestDecoderExportedLayouts$' -ort.long -v .
	fi
	go test -run '^$' -bench '^BenchmarkMLPInference$' -benchtime "${ORT_BENCHTIME:-10x}" -count 1 .
	go test -run '^$' -bench '^BenchmarkFanInference$' -benchtime "${ORT_FAN_BENCHTIME:-20x}" -count "${ORT_BENCHCOUNT:-3}" .
	go test -run '^$' -bench '^BenchmarkAllocFree$' -benchtime "${ORT_ALLOC_BENCHTIME:-20000x}" -count "${ORT_BENCHCOUNT:-3}" .
	go test -run '^$' -bench '^BenchmarkDecode$' -benchtime "${ORT_DECODE_BENCHTIME:-1x}" -count "${ORT_BENCHCOUNT:-3}" .
	exec go test -run '^$' -bench '^(BenchmarkPrefill|BenchmarkBatchDecode)$' -benchtime 1x -count "${ORT_BENCHCOUNT:-3}" .
	;;
*) die "usage: $0 [fetch|fetch-bench|test|bench|long]" ;;
esac

case "$(uname -s)/$(uname -m)" in
Linux/x86_64) ;;
*) die "ONNX Runtime from onnxruntime-node is fetched for linux/x64 only (this is $(uname -s)/$(uname -m))" ;;
esac

mkdir -p "$CACHE"

# --- ONNX Runtime ------------------------------------------------------------
# check_version prints the library's version string, read through its C API.
check_version() {
	local bin="$CACHE/ortversion"
	if [ ! -x "$bin" ] || [ "$bin" -ot "$0" ]; then
		command -v cc >/dev/null || die "a C compiler (cc) is needed to check the library and for cgo"
		cat >"$CACHE/ortversion.c" <<'C'
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
/* The first two members of OrtApiBase (ONNX Runtime's C API; see integrations/ort/ortapi.h). */
typedef struct { const void *(*GetApi)(uint32_t); const char *(*GetVersionString)(void); } ApiBase;
int main(int argc, char **argv) {
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
	const ApiBase *(*get)(void) = (const ApiBase *(*)(void))dlsym(h, "OrtGetApiBase");
	if (!get) { fprintf(stderr, "no OrtGetApiBase in %s\n", argv[1]); return 1; }
	puts(get()->GetVersionString());
	return 0;
}
C
		cc -O1 -o "$bin" "$CACHE/ortversion.c" -ldl
	fi
	"$bin" "$1"
}

if [ -f "$LIB" ] && [ "$(check_version "$LIB" 2>/dev/null || true)" = "$ORT_VERSION" ]; then
	say "reusing $LIB (ONNX Runtime $ORT_VERSION)"
else
	command -v npm >/dev/null || die "npm is needed to fetch onnxruntime-node@$ORT_VERSION"
	tmp="$(mktemp -d "$CACHE/fetch.XXXXXX")"
	trap 'rm -rf "$tmp"' EXIT
	say "fetching onnxruntime-node@$ORT_VERSION with npm pack"
	(cd "$tmp" && npm pack --silent "onnxruntime-node@$ORT_VERSION" >/dev/null) || die "npm pack onnxruntime-node@$ORT_VERSION failed"
	tgz="$(ls "$tmp"/onnxruntime-node-*.tgz)"
	tar -xzf "$tgz" -C "$tmp" --wildcards 'package/bin/napi-v6/linux/x64/libonnxruntime.so*' ||
		die "no package/bin/napi-v6/linux/x64/libonnxruntime.so* in $(basename "$tgz")"
	src="$tmp/package/bin/napi-v6/linux/x64"
	# The tarball carries either libonnxruntime.so.1 or a versioned file.
	f="$(ls "$src"/libonnxruntime.so.1* | sort | tail -n 1)"
	cp -L "$f" "$LIB.tmp"
	got="$(check_version "$LIB.tmp")" || die "could not load $f"
	[ "$got" = "$ORT_VERSION" ] || die "$f reports version $got, want $ORT_VERSION"
	mv "$LIB.tmp" "$LIB"
	rm -rf "$tmp"
	trap - EXIT
	say "installed $LIB (ONNX Runtime $got)"
fi

# --- conformance models and python3-onnx -------------------------------------
need=()
[ -d "$TESTDATA/node" ] || need+=(libonnx-testdata)
/usr/bin/python3 -c 'import onnx, numpy' 2>/dev/null || need+=(python3-onnx python3-numpy)
if [ ${#need[@]} -gt 0 ]; then
	command -v apt-get >/dev/null || die "apt-get is needed to install ${need[*]}"
	sudo=()
	[ "$(id -u)" = 0 ] || sudo=(sudo -n)
	say "installing ${need[*]} with apt-get"
	"${sudo[@]}" apt-get update -qq || die "apt-get update failed"
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${need[@]}" >/dev/null || die "apt-get install ${need[*]} failed"
fi
[ -d "$TESTDATA/node" ] || die "no ONNX conformance models under $TESTDATA"

# --- the models the benchmark and the pressure test run ---------------------
# mlp LAYERS WIDTH BATCH FILE: an MLP (MatMul, Add, Relu per layer) with
# random weights of a fixed seed, written with python3-onnx.
mlp() {
	local file="$4"
	[ -f "$file" ] && return 0 # the name says what it holds
	say "building $file with python3-onnx"
	/usr/bin/python3 - "$@" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

layers, width, batch, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = np.random.default_rng(7)
nodes, inits = [], []
prev = "x"
for i in range(layers):
    w = (rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)).astype(np.float32)
    b = np.full((width,), 0.01, dtype=np.float32)
    inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
    out = "y" if i == layers - 1 else f"r{i}"
    nodes += [
        helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
        helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
        helper.make_node("Relu", [f"a{i}"], [out]),
    ]
    prev = out
name = f"mlp{layers}x{width}"
graph = helper.make_graph(
    nodes, name,
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])],
    inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save(model, path + ".tmp")
PY
	mv "$file.tmp" "$file"
}
# The pressure test: 4 layers of width 512, batch 256 (1 MiB weights, 512 KiB activations).
mlp 4 512 256 "$SMALL"

# fan BRANCHES FILE: x [N, 64] (N, the batch, left symbolic) through
# BRANCHES parallel MatMul+Relu branches of widths 16 to 256, concatenated:
# every branch's output is live until the Concat, so a run allocates at
# least BRANCHES+1 tensors whatever ONNX Runtime's planner reuses, of sizes
# that follow the batch.
fan() {
	local file="$2"
	[ -f "$file" ] && return 0
	say "building $file with python3-onnx"
	/usr/bin/python3 - "$@" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

branches, path = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(11)
nodes, inits, outs, total = [], [], [], 0
for i in range(branches):
    width = 16 * (1 + i % 16)
    total += width
    w = (rng.standard_normal((64, width), dtype=np.float32) / 8).astype(np.float32)
    inits.append(numpy_helper.from_array(w, f"w{i}"))
    nodes += [
        helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]),
        helper.make_node("Relu", [f"m{i}"], [f"r{i}"]),
    ]
    outs.append(f"r{i}")
nodes.append(helper.make_node("Concat", outs, ["y"], axis=1))
graph = helper.make_graph(
    nodes, f"fan{branches}",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", total])],
    inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save(model, path + ".tmp")
PY
	mv "$file.tmp" "$file"
}
# The allocation benchmark and test: 128 branches (2.1 MiB of weights).
fan 128 "$FAN"
# decoder LAYERS WIDTH HEADS KV_HEADS MAX_SEQ VOCAB FF FILE: a decoder of
# random weights (seed 26) for integrations/ort's Decoder: token embedding;
# per layer LayerNormalization, Q/K/V projections, one
# com.microsoft::GroupQueryAttention node per KV head (kv_num_heads 1, its
# HEADS/KV_HEADS query heads split off, rotary embedding from cos/sin caches
# of MAX_SEQ rows), the heads concatenated, output projection, residual,
# LayerNormalization, a ReLU MLP of width FF, residual; a final
# LayerNormalization and the vocabulary projection. Inputs input_ids,
# seqlens_k, total_sequence_length, past_key.L.G and past_value.L.G
# [1, 1, rows, head_size]; outputs logits [1, 1, VOCAB] and present_key.L.G,
# present_value.L.G. One KV head per cache tensor: GroupQueryAttention's
# cache is BNSH (heads outer), so a tensor of several KV heads has its rows
# in use at the start of each head's slab; one head per tensor makes them a
# prefix, which a memgen Region backed from its start holds exactly.
decoder() {
	local file="$8"
	[ -f "$file" ] && return 0
	say "building $file with python3-onnx"
	/usr/bin/python3 - "$@" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

layers, d, heads, kvh, max_seq, vocab, ff = (int(a) for a in sys.argv[1:8])
path = sys.argv[8]
hs = d // heads
assert heads % kvh == 0 and hs % 2 == 0
group = heads // kvh
rng = np.random.default_rng(26)
inits, nodes = [], []

def w(name, shape, scale):
    a = (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)
    inits.append(numpy_helper.from_array(a, name))
    return name

def const(name, arr):
    inits.append(numpy_helper.from_array(np.asarray(arr), name))

inv = 1.0 / (10000.0 ** (np.arange(0, hs, 2, dtype=np.float64) / hs))
ang = np.outer(np.arange(max_seq, dtype=np.float64), inv)
const("cos_cache", np.cos(ang).astype(np.float32))  # [max_seq, hs/2]
const("sin_cache", np.sin(ang).astype(np.float32))
const("split_q", np.full((kvh,), group * hs, dtype=np.int64))
const("split_kv", np.full((kvh,), hs, dtype=np.int64))
const("ln_g", np.ones((d,), dtype=np.float32))
const("ln_b", np.zeros((d,), dtype=np.float32))

w("embed", (vocab, d), 1.0)
nodes.append(helper.make_node("Gather", ["embed", "input_ids"], ["x0"], axis=0))
inputs = [
    helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 1]),
    helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
    helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
]
outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, vocab])]
x = "x0"
for l in range(layers):
    p = f"l{l}."
    nodes.append(helper.make_node("LayerNormalization", [x, "ln_g", "ln_b"], [p + "h"], axis=-1, epsilon=1e-5))
    for n, cols in (("q", heads * hs), ("k", kvh * hs), ("v", kvh * hs)):
        nodes.append(helper.make_node("MatMul", [p + "h", w(p + "w" + n, (d, cols), 1 / np.sqrt(d))], [p + n]))
    qs = [f"{p}q{g}" for g in range(kvh)]
    ks = [f"{p}k{g}" for g in range(kvh)]
    vs = [f"{p}v{g}" for g in range(kvh)]
    nodes.append(helper.make_node("Split", [p + "q", "split_q"], qs, axis=2))
    nodes.append(helper.make_node("Split", [p + "k", "split_kv"], ks, axis=2))
    nodes.append(helper.make_node("Split", [p + "v", "split_kv"], vs, axis=2))
    outs = []
    for g in range(kvh):
        pk, pv = f"past_key.{l}.{g}", f"past_value.{l}.{g}"
        ck, cv = f"present_key.{l}.{g}", f"present_value.{l}.{g}"
        inputs += [helper.make_tensor_value_info(pk, TensorProto.FLOAT, [1, 1, "past_sequence_length", hs]),
                   helper.make_tensor_value_info(pv, TensorProto.FLOAT, [1, 1, "past_sequence_length", hs])]
        outputs += [helper.make_tensor_value_info(ck, TensorProto.FLOAT, [1, 1, "present_sequence_length", hs]),
                    helper.make_tensor_value_info(cv, TensorProto.FLOAT, [1, 1, "present_sequence_length", hs])]
        o = f"{p}attn{g}"
        nodes.append(helper.make_node(
            "GroupQueryAttention",
            [qs[g], ks[g], vs[g], pk, pv, "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"],
            [o, ck, cv], domain="com.microsoft", num_heads=group, kv_num_heads=1, do_rotary=1))
        outs.append(o)
    nodes.append(helper.make_node("Concat", outs, [p + "attn"], axis=2))
    nodes.append(helper.make_node("MatMul", [p + "attn", w(p + "wo", (heads * hs, d), 1 / np.sqrt(d))], [p + "o"]))
    nodes.append(helper.make_node("Add", [x, p + "o"], [p + "x1"]))
    nodes.append(helper.make_node("LayerNormalization", [p + "x1", "ln_g", "ln_b"], [p + "h2"], axis=-1, epsilon=1e-5))
    nodes.append(helper.make_node("MatMul", [p + "h2", w(p + "w1", (d, ff), 1 / np.sqrt(d))], [p + "m"]))
    nodes.append(helper.make_node("Relu", [p + "m"], [p + "r"]))
    nodes.append(helper.make_node("MatMul", [p + "r", w(p + "w2", (ff, d), 1 / np.sqrt(ff))], [p + "f"]))
    nodes.append(helper.make_node("Add", [p + "x1", p + "f"], [p + "x2"]))
    x = p + "x2"
nodes.append(helper.make_node("LayerNormalization", [x, "ln_g", "ln_b"], ["hf"], axis=-1, epsilon=1e-5))
nodes.append(helper.make_node("MatMul", ["hf", w("lm_head", (d, vocab), 1 / np.sqrt(d))], ["logits"]))
graph = helper.make_graph(nodes, f"gqa_decoder_{layers}x{d}", inputs, outputs, inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save(model, path + ".tmp")
PY
	mv "$file.tmp" "$file"
}
# exported LAYOUT LAYERS WIDTH HEADS KV_HEADS MAX_POS VOCAB FF FILE: a decoder
# of random weights (seed 45) in the interface another tool exports, which
# ort.NewDecoder reads as it comes. Its input and output names, element
# types, shapes (dim_param strings included) and GroupQueryAttention
# attributes are those of a real export; the layers between them are this
# script's (LayerNormalization and a ReLU MLP, as in the decoder above).
#
#   genai-mask     ONNX Runtime GenAI's model builder for the CPU, fp32
#                  (microsoft/onnxruntime-genai, src/python/py/models/builder.py
#                  at commit 001faddf214642b925052728235c1577bb6eb606:
#                  Model.__init__'s input_types/input_shapes/output_shapes,
#                  make_inputs_and_outputs, make_group_query_attention,
#                  make_attention_mask_reformatting_for_gqa). Inputs
#                  input_ids int64 [batch_size, sequence_length],
#                  attention_mask int64 [batch_size, total_sequence_length],
#                  past_key_values.N.key/.value float [batch_size, KV_HEADS,
#                  past_sequence_length, head_size]; outputs logits float
#                  [batch_size, sequence_length, VOCAB], present.N.key/.value
#                  float [batch_size, KV_HEADS, total_sequence_length,
#                  head_size]. GQA with rotary embedding in the node removes
#                  position_ids. seqlens_k = Cast<int32>(ReduceSum(mask, 1) - 1)
#                  and total_sequence_length = Cast<int32>(Shape(mask)[1]) are
#                  computed in the graph; one com.microsoft::GroupQueryAttention
#                  per layer over packed QKV (key and value inputs empty) with
#                  num_heads, kv_num_heads, scale 1/sqrt(head_size),
#                  do_rotary 1, rotary_interleaved 0; past and present share
#                  one buffer (genai_config's past_present_share_buffer).
#   genai-seqlens  the same decoder taking GroupQueryAttention's lengths
#                  directly, declared as ONNX Runtime's GQA tests declare them
#                  (microsoft/onnxruntime,
#                  onnxruntime/test/python/transformers/test_gqa_cpu.py at
#                  commit 0349678c7786a5fc80ee6d19f1b00d1d4f9dffea,
#                  create_group_query_attention_graph_past): seqlens_k int32
#                  [batch_size], total_sequence_length int32 [1]; no
#                  attention_mask.
#   optimum        Hugging Face Optimum's ONNX export of a Llama/Qwen2 decoder
#                  with past (huggingface/optimum at commit
#                  31d4ea9ce98863805aa20f98bf60b4214ab3706f, the last before
#                  the exporter moved to optimum-onnx:
#                  optimum/exporters/onnx/config.py TextDecoderOnnxConfig and
#                  TextDecoderWithPositionIdsOnnxConfig, base.py
#                  OnnxConfigWithPast.add_past_key_values and the
#                  text-generation outputs; model_configs.py LlamaOnnxConfig,
#                  whose past has num_key_value_heads): inputs input_ids int64
#                  [batch_size, sequence_length], attention_mask int64
#                  [batch_size, past_sequence_length + sequence_length],
#                  position_ids int64 [batch_size, sequence_length],
#                  past_key_values.N.key/.value float [batch_size, KV_HEADS,
#                  past_sequence_length, head_size]; outputs logits float
#                  [batch_size, sequence_length, VOCAB], present.N.key/.value
#                  float [batch_size, KV_HEADS, past_sequence_length + 1,
#                  head_size]. The attention is plain ONNX operators, as
#                  torch.onnx exports it: rotary embedding gathered at
#                  position_ids, present = Concat(past, new) on the sequence
#                  axis, the query heads grouped over their KV head, a causal
#                  and attention_mask bias, Softmax. No share buffer: every
#                  step's present is a new, longer tensor.
exported() {
	local file="$9"
	[ -f "$file" ] && return 0
	say "building $file with python3-onnx"
	/usr/bin/python3 - "$@" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

layout = sys.argv[1]
layers, d, heads, kvh, max_pos, vocab, ff = (int(a) for a in sys.argv[2:9])
path = sys.argv[9]
hs = d // heads
assert heads % kvh == 0 and hs % 2 == 0
group = heads // kvh
rng = np.random.default_rng(45)
inits, nodes = [], []
F, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64

def w(name, shape, scale):
    a = (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)
    inits.append(numpy_helper.from_array(a, name))
    return name

def const(name, arr):
    inits.append(numpy_helper.from_array(np.asarray(arr), name))
    return name

def node(op, ins, outs, **kw):
    nodes.append(helper.make_node(op, ins, outs, **kw))
    return outs[0]

inv = 1.0 / (10000.0 ** (np.arange(0, hs, 2, dtype=np.float64) / hs))
ang = np.outer(np.arange(max_pos, dtype=np.float64), inv)
const("cos_cache", np.cos(ang).astype(np.float32))  # [max_pos, head_size/2]
const("sin_cache", np.sin(ang).astype(np.float32))
const("ln_g", np.ones((d,), dtype=np.float32))
const("ln_b", np.zeros((d,), dtype=np.float32))
const("one_i64", np.array(1, dtype=np.int64))
const("zero_i64", np.array(0, dtype=np.int64))
const("axes1", np.array([1], dtype=np.int64))

inputs = [helper.make_tensor_value_info("input_ids", I64, ["batch_size", "sequence_length"])]
outputs = [helper.make_tensor_value_info("logits", F, ["batch_size", "sequence_length", vocab])]
if layout == "genai-mask":
    inputs.append(helper.make_tensor_value_info("attention_mask", I64, ["batch_size", "total_sequence_length"]))
    # make_attention_mask_reformatting_for_gqa
    node("ReduceSum", ["attention_mask", "axes1"], ["mask_sum"])
    node("Sub", ["mask_sum", "axes1"], ["mask_sum_1"])  # axes1 is [1]: minus one
    node("Cast", ["mask_sum_1"], ["seqlens_k"], to=I32)
    node("Shape", ["attention_mask"], ["mask_shape"])
    node("Gather", ["mask_shape", "one_i64"], ["mask_len"], axis=0)
    node("Cast", ["mask_len"], ["total_sequence_length"], to=I32)
elif layout == "genai-seqlens":
    inputs.append(helper.make_tensor_value_info("seqlens_k", I32, ["batch_size"]))
    inputs.append(helper.make_tensor_value_info("total_sequence_length", I32, [1]))
elif layout == "optimum":
    inputs.append(helper.make_tensor_value_info("attention_mask", I64, ["batch_size", "past_sequence_length + sequence_length"]))
    inputs.append(helper.make_tensor_value_info("position_ids", I64, ["batch_size", "sequence_length"]))
    # The additive bias: key j is seen by query i (absolute position
    # past + i) when j <= past + i and attention_mask[b, j] is 1.
    node("Shape", ["attention_mask"], ["am_shape"])
    node("Gather", ["am_shape", "one_i64"], ["tot"], axis=0)
    node("Shape", ["input_ids"], ["ids_shape"])
    node("Gather", ["ids_shape", "one_i64"], ["seq"], axis=0)
    node("Sub", ["tot", "seq"], ["past"])
    node("Range", ["zero_i64", "tot", "one_i64"], ["kpos"])
    node("Range", ["zero_i64", "seq", "one_i64"], ["qrel"])
    node("Add", ["qrel", "past"], ["qpos"])
    node("Unsqueeze", ["qpos", "axes1"], ["qpos2"])
    node("LessOrEqual", ["kpos", "qpos2"], ["causal"])  # [S, T]
    node("Cast", ["attention_mask"], ["am_bool"], to=TensorProto.BOOL)
    node("Unsqueeze", ["am_bool", "axes1"], ["am3"])  # [B, 1, T]
    node("And", ["causal", "am3"], ["seen"])  # [B, S, T]
    const("bias_on", np.array(0.0, dtype=np.float32))
    const("bias_off", np.array(np.finfo(np.float32).min, dtype=np.float32))
    node("Where", ["seen", "bias_on", "bias_off"], ["bias3"])
    const("axes12", np.array([1, 2], dtype=np.int64))
    node("Unsqueeze", ["bias3", "axes12"], ["bias5"])  # [B, 1, 1, S, T]
    node("Gather", ["cos_cache", "position_ids"], ["cos_h"], axis=0)  # [B, S, hs/2]
    node("Gather", ["sin_cache", "position_ids"], ["sin_h"], axis=0)
    node("Concat", ["cos_h", "cos_h"], ["cos_f"], axis=-1)
    node("Concat", ["sin_h", "sin_h"], ["sin_f"], axis=-1)
    node("Unsqueeze", ["cos_f", "axes1"], ["cos4"])  # [B, 1, S, hs]
    node("Unsqueeze", ["sin_f", "axes1"], ["sin4"])
    const("shape_q", np.array([0, 0, heads, hs], dtype=np.int64))
    const("shape_kv", np.array([0, 0, kvh, hs], dtype=np.int64))
    const("shape_q5", np.array([0, kvh, group, -1, hs], dtype=np.int64))
    const("shape_o4", np.array([0, heads, -1, hs], dtype=np.int64))
    const("shape_o3", np.array([0, 0, heads * hs], dtype=np.int64))
    const("axes2", np.array([2], dtype=np.int64))
    const("half_lo", np.array([0], dtype=np.int64))
    const("half_mid", np.array([hs // 2], dtype=np.int64))
    const("half_hi", np.array([hs], dtype=np.int64))
    const("axis_last", np.array([-1], dtype=np.int64))
    const("scale", np.array(1 / np.sqrt(hs), dtype=np.float32))
else:
    raise SystemExit("unknown layout " + layout)

w("embed", (vocab, d), 1.0)
x = node("Gather", ["embed", "input_ids"], ["x0"], axis=0)

def rotary(p, t):
    lo = node("Slice", [t, "half_lo", "half_mid", "axis_last"], [p + "lo"])
    hi = node("Slice", [t, "half_mid", "half_hi", "axis_last"], [p + "hi"])
    neg = node("Neg", [hi], [p + "neg"])
    rh = node("Concat", [neg, lo], [p + "rh"], axis=-1)
    a = node("Mul", [t, "cos4"], [p + "c"])
    b = node("Mul", [rh, "sin4"], [p + "s"])
    return node("Add", [a, b], [p + "rot"])

for l in range(layers):
    p = f"/model/layers.{l}/"
    pk, pv = f"past_key_values.{l}.key", f"past_key_values.{l}.value"
    ck, cv = f"present.{l}.key", f"present.{l}.value"
    if layout == "optimum":
        past_len, present_len = "past_sequence_length", "past_sequence_length + 1"
    else:
        past_len, present_len = "past_sequence_length", "total_sequence_length"
    inputs += [helper.make_tensor_value_info(pk, F, ["batch_size", kvh, past_len, hs]),
               helper.make_tensor_value_info(pv, F, ["batch_size", kvh, past_len, hs])]
    outputs += [helper.make_tensor_value_info(ck, F, ["batch_size", kvh, present_len, hs]),
                helper.make_tensor_value_info(cv, F, ["batch_size", kvh, present_len, hs])]
    h = node("LayerNormalization", [x, "ln_g", "ln_b"], [p + "h"], axis=-1, epsilon=1e-5)
    if layout != "optimum":
        qkv = node("MatMul", [h, w(p + "qkv", (d, (heads + 2 * kvh) * hs), 1 / np.sqrt(d))], [p + "qkv_out"])
        # make_group_query_attention: its inputs and attributes, in its order.
        nodes.append(helper.make_node(
            "GroupQueryAttention",
            [qkv, "", "", pk, pv, "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"],
            [p + "attn", ck, cv], name=p + "attn/GroupQueryAttention", domain="com.microsoft",
            num_heads=heads, kv_num_heads=kvh, scale=float(1 / np.sqrt(hs)), do_rotary=1, rotary_interleaved=0))
        attn = p + "attn"
    else:
        q = node("MatMul", [h, w(p + "wq", (d, heads * hs), 1 / np.sqrt(d))], [p + "q"])
        k = node("MatMul", [h, w(p + "wk", (d, kvh * hs), 1 / np.sqrt(d))], [p + "k"])
        v = node("MatMul", [h, w(p + "wv", (d, kvh * hs), 1 / np.sqrt(d))], [p + "v"])
        q = node("Transpose", [node("Reshape", [q, "shape_q"], [p + "q4"])], [p + "qt"], perm=[0, 2, 1, 3])
        k = node("Transpose", [node("Reshape", [k, "shape_kv"], [p + "k4"])], [p + "kt"], perm=[0, 2, 1, 3])
        v = node("Transpose", [node("Reshape", [v, "shape_kv"], [p + "v4"])], [p + "vt"], perm=[0, 2, 1, 3])
        q, k = rotary(p + "qr_", q), rotary(p + "kr_", k)
        node("Concat", [pk, k], [ck], axis=2)  # [B, kvh, T, hs]
        node("Concat", [pv, v], [cv], axis=2)
        q5 = node("Reshape", [q, "shape_q5"], [p + "q5"])  # [B, kvh, group, S, hs]
        k5 = node("Unsqueeze", [ck, "axes2"], [p + "k5"])  # [B, kvh, 1, T, hs]
        v5 = node("Unsqueeze", [cv, "axes2"], [p + "v5"])
        kT = node("Transpose", [k5], [p + "kT"], perm=[0, 1, 2, 4, 3])
        sc = node("Mul", [node("MatMul", [q5, kT], [p + "qk"]), "scale"], [p + "qks"])
        sc = node("Add", [sc, "bias5"], [p + "qkb"])
        pr = node("Softmax", [sc], [p + "probs"], axis=-1)
        o = node("MatMul", [pr, v5], [p + "o5"])
        o = node("Reshape", [o, "shape_o4"], [p + "o4"])
        o = node("Transpose", [o], [p + "ot"], perm=[0, 2, 1, 3])
        attn = node("Reshape", [o, "shape_o3"], [p + "attn"])
    o = node("MatMul", [attn, w(p + "wo", (heads * hs, d), 1 / np.sqrt(d))], [p + "o"])
    x1 = node("Add", [x, o], [p + "x1"])
    h2 = node("LayerNormalization", [x1, "ln_g", "ln_b"], [p + "h2"], axis=-1, epsilon=1e-5)
    m = node("Relu", [node("MatMul", [h2, w(p + "w1", (d, ff), 1 / np.sqrt(d))], [p + "m"])], [p + "r"])
    f = node("MatMul", [m, w(p + "w2", (ff, d), 1 / np.sqrt(ff))], [p + "f"])
    x = node("Add", [x1, f], [p + "x2"])
hf = node("LayerNormalization", [x, "ln_g", "ln_b"], ["hf"], axis=-1, epsilon=1e-5)
node("MatMul", [hf, w("lm_head", (d, vocab), 1 / np.sqrt(d))], ["logits"])
graph = helper.make_graph(nodes, "main_graph", inputs, outputs, inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
model.ir_version = 8
model.producer_name = "memgen scripts/ort.sh (" + layout + ")"
onnx.checker.check_model(model)
onnx.save(model, path + ".tmp")
PY
	mv "$file.tmp" "$file"
}
# The Decoder's tests and benchmark: 4 layers of width 256, 4 query heads
# and 2 KV heads of size 64 (256-byte cache rows), 4,096 rows, a vocabulary
# of 1,024, an MLP of width 1,024 (14 MB).
decoder 4 256 4 2 4096 1024 1024 "$DECODER"
# The exported layouts the Decoder reads as they come: 2 layers of width
# 256, 4 query heads and 2 KV heads of size 64, rotary caches of 4,096
# positions, a vocabulary of 1,024, an MLP of width 1,024 (9 MB each).
exported genai-mask 2 256 4 2 4096 1024 1024 "$GENAI_MASK"
exported genai-seqlens 2 256 4 2 4096 1024 1024 "$GENAI_SEQLENS"
exported optimum 2 256 4 2 4096 1024 1024 "$OPTIMUM"
# BenchmarkPrefill's and BenchmarkBatchDecode's decoder, in GenAI's layout
# with attention_mask as above, of a size where a Run's weight products
# weigh more than its fixed cost: 4 layers of width 1,024, 16 query heads
# and 4 KV heads of size 64, rotary caches of 2,048 positions, a
# vocabulary of 8,192, an MLP of width 2,816 (50M parameters, 202 MB).
exported genai-mask 4 1024 16 4 2048 8192 2816 "$GENAI_BENCH"
# The benchmark, for bench only: 24 layers of width 2048 (16 MiB of weights
# each, 403 MB in all), batch 64 (512 KiB activations between layers).
[ "$mode" = fetch-bench ] && mlp 24 2048 64 "$MODEL"

{
	echo "MEMGEN_ORT_LIB=$LIB"
	echo "MEMGEN_ONNX_TESTDATA=$TESTDATA"
	echo "MEMGEN_ORT_SMALL_MODEL=$SMALL"
	echo "MEMGEN_ORT_FAN_MODEL=$FAN"
	echo "MEMGEN_ORT_DECODER_MODEL=$DECODER"
	echo "MEMGEN_ORT_GENAI_MASK_MODEL=$GENAI_MASK"
	echo "MEMGEN_ORT_GENAI_SEQLENS_MODEL=$GENAI_SEQLENS"
	echo "MEMGEN_ORT_OPTIMUM_MODEL=$OPTIMUM"
	echo "MEMGEN_ORT_GENAI_BENCH_MODEL=$GENAI_BENCH"
	[ ! -f "$MODEL" ] || echo "MEMGEN_ORT_BENCH_MODEL=$MODEL"
} >"$CACHE/env"
cat "$CACHE/env"
