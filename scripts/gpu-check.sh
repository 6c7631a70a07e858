#!/usr/bin/env bash
# The CUDA engine's check on a GPU machine, as one device call of under 8 minutes.
#
#   scripts/gpu-check.sh --pack   here, before the call: build the GPU tests, the decode
#                                 benchmark and a `gateway` without FFmpeg (feature cuda), strip
#                                 them into .gpu/ (about 50 MB; the device call carries .gpu)
#   scripts/gpu-check.sh          there (no cargo, no network): every section below, each under
#                                 its own timeout; logs, bench.json, peer.json and results.json
#                                 under $OUT; a summary line per section; exit 1 if any failed
#   scripts/gpu-check.sh --dry-run here, after --pack: the same sections with the emulator's
#                                 tests, the tiny shape and the CPU, to check the script's own
#                                 plumbing (paths, JSON, HTTP) where there is no GPU; PYTHON names
#                                 a python with torch and transformers
#
# Sections: env (card, driver, libraries) · kernels (every kernel against its CPU reference,
# `cuda::` tests) · nvrtc (every source compiles for the device) · models (random-init bf16
# SmolLM2-135M- and 1B-shaped checkpoints and float32 transformers references, made there) ·
# decoder (the GPU decoder against the CPU one on the committed tiny checkpoints) · parity
# (greedy and top-5 logprobs against transformers) · bench (decode step at batch 1 and 32,
# prefill at 2048, transformers eager and the copy bandwidth in the same run) · http (the
# gateway serving the 1B folder: chat, streams, completions, 32 concurrent streams, metrics) ·
# sanitize (compute-sanitizer racecheck on the kernel tests, memcheck on a decoder test).
set -uo pipefail
cd "$(dirname "$0")/.."

pack() {
  set -e
  rm -rf .gpu && mkdir -p .gpu
  cargo build --release -p gateway --no-default-features --features cuda
  cp target/release/gateway .gpu/gateway
  cargo build --release -p engine --features cuda --example decode_bench
  cp target/release/examples/decode_bench .gpu/decode_bench
  {
    cargo test --no-run -p kernels --features cuda --message-format=json \
      --test gpu_norm --test gpu_elementwise --test gpu_attention --test gpu_sampling \
      --test nvrtc_compile
    cargo test --no-run -p engine --features cuda --message-format=json \
      --test gpu_decoder --test gpu_parity
  } | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"]:
        shutil.copy(m["executable"], ".gpu/" + m["target"]["name"])
'
  strip .gpu/*
  ls -la .gpu
  local kib
  kib=$(du -sk .gpu | cut -f1)
  echo "packed $((kib / 1024)) MiB into .gpu"
  [ "$kib" -lt $((56 * 1024)) ] || { echo "too big to carry (64 MiB with the tree)" >&2; exit 1; }
}

if [ "${1:-}" = "--pack" ]; then
  pack
  exit
fi

DRY=
[ "${1:-}" = "--dry-run" ] && DRY=1
PY="${PYTHON:-python3}"
if [ -n "$DRY" ]; then
  TESTS=emu:: SHAPES=tiny MAIN=tiny DEVICE=cpu DTYPE=auto BENCH="--prefill 64 --decode-tokens 8"
else
  TESTS=cuda:: SHAPES="smol 1b" MAIN=1b DEVICE=cuda DTYPE=bfloat16 BENCH="--prefill 2048 --decode-tokens 64"
fi

OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
export RUST_BACKTRACE=1 GATEWAY_KERNEL_CACHE=/tmp/gateway-kernels GATEWAY_TEST_DATA=$PWD/tests/data
nv=$("$PY" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${nv}:$PWD/models-cache/nvrtc/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
MODELS=/tmp/gpu-check-models
STATUS=()

section() { # name timeout command...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  echo "=== $name" | tee -a "$OUT/summary.txt"
  # A fresh bash, so that a section may be one of the functions below (exported) and the
  # timeout kills the whole of it.
  timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local verdict=PASS
  [ $rc -eq 0 ] || verdict="FAIL (rc $rc)"
  [ $rc -eq 124 ] && verdict="FAIL (timed out after ${limit}s)"
  echo "$name: $verdict in $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
  tail -n 25 "$OUT/$name.log"
  STATUS+=("$name:$verdict")
}

env_info() {
  [ -n "$DRY" ] || nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  ls /usr/local/cuda/lib64 2>/dev/null | grep -E '^lib(nvrtc|cublas|cublasLt)\.so' || true
  [ -n "$nv" ] && ls "$nv" | grep -E 'nvrtc' || true
  "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  uname -r
  ldd .gpu/gateway | grep -E 'not found' && return 1
  return 0
}

kernels() {
  local rc=0
  for t in gpu_norm gpu_elementwise gpu_attention gpu_sampling; do
    GATEWAY_CUDA_SYNC=1 ".gpu/$t" --include-ignored --test-threads 1 "$TESTS" || rc=1
  done
  return $rc
}

models() {
  set -e
  for shape in $SHAPES; do
    "$PY" scripts/gpu_reference.py make --shape "$shape" --out "$MODELS/$shape"
    "$PY" scripts/gpu_reference.py reference --model "$MODELS/$shape" \
      --out "$MODELS/$shape/reference.json" --prompts 5 --new-tokens 16
  done
}

bench() {
  set -e
  # shellcheck disable=SC2086
  .gpu/decode_bench --model "$MODELS/$MAIN" --device "$DEVICE" --dtype "$DTYPE" --threads 16 \
    --batches 1,32 $BENCH | tee "$OUT/bench.json"
  "$PY" scripts/gpu_reference.py time --model "$MODELS/$MAIN" --out "$OUT/peer.json"
  python3 - "$OUT" "$MODELS/$MAIN" <<'PY'
import json, os, sys
out, model = sys.argv[1], sys.argv[2]
ours = json.loads(open(os.path.join(out, "bench.json")).read().strip().splitlines()[-1])
peer = json.load(open(os.path.join(out, "peer.json")))
cfg = json.load(open(os.path.join(model, "config.json")))
bw = peer["copy_gb_s"] * 1e9
kv_per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * (cfg["hidden_size"] // cfg["num_attention_heads"]) * 2
res = {"ours": ours, "peer": peer}
for b in (1, 32):
    # Weights once per step, plus each sequence's KV (32-token prompt, half the decode run).
    kv = b * (32 + 32) * kv_per_token
    floor_ms = (peer["weight_bytes"] + kv) / bw * 1e3
    step = ours.get(f"decode_b{b}_step_ms")
    res[f"b{b}"] = {"step_ms": step, "floor_ms": round(floor_ms, 3),
                    "over_floor": round(step / floor_ms, 1) if step else None}
res["b1"]["transformers_eager_ms"] = peer["transformers_eager_decode_b1_step_ms"]
res["b1"]["vs_transformers"] = round(peer["transformers_eager_decode_b1_step_ms"] / res["b1"]["step_ms"], 2)
json.dump(res, open(os.path.join(out, "results.json"), "w"), indent=1)
print(json.dumps(res))
PY
}

http() {
  local port=8765 pid rc
  .gpu/gateway serve --model "$MODELS/$MAIN" --served-model-name gpu-1b --device "$DEVICE" \
    --port "$port" --max-model-len 1024 >"$OUT/gateway.log" 2>&1 &
  pid=$!
  trap 'kill "$pid" 2>/dev/null' EXIT
  for _ in $(seq 120); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" \
      >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { echo "the gateway exited"; tail -30 "$OUT/gateway.log"; return 1; }
    sleep 1
  done
  python3 scripts/gpu_http_check.py --base-url "http://127.0.0.1:$port" --model gpu-1b --streams 32 \
    --expect-device "$DEVICE"
  rc=$?
  kill -TERM "$pid"
  wait "$pid"
  grep -E 'CUDA|KV cache|weights on|device' "$OUT/gateway.log" | head -20
  return $rc
}

sanitize() {
  [ -z "$DRY" ] || { echo "dry run: no compute-sanitizer"; return 0; }
  local cs rc=0
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  [ -n "$cs" ] || { echo "no compute-sanitizer"; return 1; }
  for t in gpu_attention gpu_sampling gpu_elementwise; do
    "$cs" --tool racecheck --error-exitcode 9 ".gpu/$t" --include-ignored --test-threads 1 cuda:: || rc=1
  done
  "$cs" --tool memcheck --error-exitcode 9 .gpu/gpu_decoder --include-ignored --test-threads 1 \
    cuda::tiny_vl_f32 || rc=1
  return $rc
}

export DRY PY TESTS SHAPES MAIN DEVICE DTYPE BENCH OUT MODELS nv
export -f env_info kernels models bench http sanitize

section env 20 env_info
section nvrtc 45 .gpu/nvrtc_compile --nocapture
section kernels 60 kernels
section models 120 models
section decoder 45 env GATEWAY_CUDA_SYNC=1 .gpu/gpu_decoder --include-ignored --test-threads 1 \
  "${TESTS}tiny"
if [ -n "$DRY" ]; then
  section parity 90 .gpu/gpu_parity --nocapture tiny_llama
else
  section parity 90 env GPU_PARITY_DIR="$MODELS/smol:$MODELS/1b" .gpu/gpu_parity \
    --include-ignored --nocapture transformers_parity_on_the_gpu
fi
section bench 90 bench
section http 90 http
# Last, with what time is left: races and bad accesses that the emulator cannot see (it runs
# a block's threads one at a time between barriers).
section sanitize 90 sanitize

echo "${STATUS[*]}" | tee -a "$OUT/summary.txt"
case "${STATUS[*]}" in *FAIL*) exit 1 ;; esac
