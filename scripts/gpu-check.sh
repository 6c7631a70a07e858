#!/usr/bin/env bash
# The CUDA engine's check on a GPU machine (an H100 or H200: sm_90, CUDA 13.0 with NVRTC and
# cuBLAS, python3 with torch and transformers; no cargo, no network), as one device call that
# ends within 6 minutes, leaving time in the session's 15 for a rerun.
#
# 1. Here, with cargo and NVRTC (`make nvrtc`):
#      scripts/gpu-check.sh --pack
#    builds the binaries the sections run (profile gpu-pack, feature cuda, no FFmpeg), strips
#    them, compiles every kernel source for sm_90 with NVRTC under the names the backend looks
#    up, and packs it all into .gpu/pack.tar.xz (xz: it travels at a fraction of its size) with
#    .gpu/manifest.json; fails if .gpu plus the tree that travels passes 48 MiB.
# 2. One device call: command `scripts/gpu-check.sh`, carry [".gpu"], timeout_s 420. It runs the
#    sections below in order, each under its limit and all under a 360 s deadline (a section
#    gets the smaller of its limit and the time left), with GATEWAY_KERNEL_CACHE pointing at the
#    packed cubins: the device compiles nothing. What comes back in $OUT (at most 6 files):
#      summary.json   rewritten when each section starts and ends: per section its verdict,
#                     seconds, limit, key figures and the log's last lines; `running` names the
#                     section a killed run was in, and `verdict` is INCOMPLETE until the end
#      summary.txt    the same in one line a section
#      check.log      every finished section's output; running.log the one in progress
#      gateway.log    the http section's server log
#      results.json   the bench section's figures (ours, transformers eager, the floor)
#    Exit status 1 if a section failed or the deadline left one no time.
# 3. Here, as part of `make test`:
#      scripts/gpu-check.sh --dry-run [CARGO TEST FLAGS]
#    the same sections on the kernels' CPU emulator (`emu::` tests), the tiny shape and the CPU
#    device, with the binaries `cargo test --workspace FLAGS` built (profile dev; make test
#    passes its features, so nothing is built again) and torch and transformers from
#    `scripts/fetch-torch.sh`, to check the script's own plumbing; the nvrtc section fills a
#    cache with this machine's NVRTC and checks it without a device to load it.
#
# Sections, cheap and telling first (limits on the device):
#   env      10  unpacks the pack; the card, driver, libraries, torch and transformers
#   nvrtc    20  every source's packed cubin is there for the device's architecture and NVRTC,
#                defines its entry points, and the device loads them all from the cache
#                (the backend's "CUDA kernels ready": from_cache == sources, nothing written)
#   kernels  45  every kernel against its CPU reference (`cuda::` tests of the kernels crate)
#   decoder  30  the GPU decoder against the CPU one on the committed tiny checkpoints
#   models   75  random-init bf16 SmolLM2-135M- and Llama-1B-shaped checkpoints, initialised on
#                the GPU, their float32 transformers references, and transformers' own
#                bfloat16 spread against them (the bfloat16 tolerance)
#   parity   40  greedy tokens and top-5 logprobs against those references, float32 and bfloat16
#   invariance
#            20  batch invariance on the device's cuBLAS and kernels: a sequence's logits bit for
#                bit alone, among other sequences, prefilled in chunks and after a prefix-cache
#                hit (engine/tests/invariance), on the tiny checkpoints in both types and on
#                those two folders in bfloat16; and a request's sampling beside a host-only one
#   http     35  the gateway serving the 1B folder: chat, streams, completions, 32 concurrent
#                streams, metrics; its log must show every kernel taken from the cache
#   warm     25  a warm restart through the GPU weight cache against a cold start: the time
#                to /health of `serve` loading from disk, of `preload --device cuda`, and of
#                `serve --load-format ipc_cache` mapping the daemon's device weights (its log
#                must say so, and its greedy reply with logprobs must be the cold one's)
#   bench    55  decode step at batch 1 and 32, prefill at 2048, transformers eager and the
#                copy bandwidth in the same run, against the memory-bandwidth floor
#   sanitize     optional, last, with the time left: compute-sanitizer racecheck on the kernel
#                tests and memcheck on a decoder test; SKIP where it cannot run on the machine
set -uo pipefail
cd "$(dirname "$0")/.."

# The device tool carries 64 MiB (tree, pack and all); the rest is headroom for the tree's growth.
MAX_CARRY_MIB=48
# The sections' limits below sum to 355 s; the deadline bounds the whole run.
DEADLINE=${GPU_CHECK_DEADLINE:-360}
NVRTC_LIB=$PWD/models-cache/nvrtc/nvidia/cu13/lib

# Bytes of what the device call carries: the tree (tracked and untracked-not-ignored files, as
# the device tool copies it) and .gpu.
carried_bytes() {
  local tree gpu
  tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  gpu=$(du -sb .gpu | cut -f1)
  echo "$tree $gpu"
}

pack() {
  set -e
  [ -e "$NVRTC_LIB/libnvrtc.so.13" ] || scripts/fetch-nvrtc.sh >/dev/null
  local p=(--profile gpu-pack) stage=target/gpu-pack/stage json=target/gpu-pack/artifacts.json
  mkdir -p target/gpu-pack
  rm -rf .gpu "$stage" && mkdir -p .gpu "$stage"
  # No FFmpeg (the GPU machine has none). The selection is scripts/gpu_check_bins.py's.
  cargo build "${p[@]}" -p gateway --no-default-features --features cuda --message-format=json >"$json"
  cargo build "${p[@]}" -p engine --features cuda --example decode_bench --message-format=json >>"$json"
  cargo build "${p[@]}" -p kernels --features cuda --example kernel_cache --message-format=json >>"$json"
  cargo test "${p[@]}" --no-run -p kernels --features cuda --message-format=json >>"$json"
  cargo test "${p[@]}" --no-run -p engine --features cuda --message-format=json \
    --test gpu_decoder --test gpu_parity >>"$json"
  python3 scripts/gpu_check_bins.py "$stage" --copy <"$json"
  find "$stage" -maxdepth 1 -type f -perm -u+x -exec strip {} +
  LD_LIBRARY_PATH="$NVRTC_LIB:${LD_LIBRARY_PATH:-}" "$stage/kernel_cache" fill "$stage/kernels" \
    --arch sm_90 >"$stage/kernels.json"
  # Compressed, the binaries travel at a fraction of their size; unpacking takes a second there.
  python3 - "$stage" <<'PY'
import json, os, subprocess, sys, tarfile, time
stage = sys.argv[1]
files = {}
for root, _, names in os.walk(stage):
    for n in names:
        full = os.path.join(root, n)
        files[os.path.relpath(full, stage)] = os.path.getsize(full)
with tarfile.open(".gpu/pack.tar.xz", "w:xz", preset=9) as t:
    t.add(stage, arcname=".")
git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
manifest = {"commit": git("rev-parse", "--short", "HEAD")
            + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else ""),
            "made": time.strftime("%Y-%m-%d %H:%M:%S"), "files": dict(sorted(files.items())),
            "unpacked_bytes": sum(files.values()),
            "packed_bytes": os.path.getsize(".gpu/pack.tar.xz"),
            "kernels": json.load(open(os.path.join(stage, "kernels.json")))}
json.dump(manifest, open(".gpu/manifest.json", "w"), indent=1)
for n, b in manifest["files"].items():
    if not n.startswith("kernels/"):
        print(f"{b / 2**20:7.2f} MiB  {n}")
k = manifest["kernels"]
print(f"{k['bytes'] / 2**20:7.2f} MiB  kernels/ ({k['sources']} cubins for {k['arch']})")
print(f"{manifest['unpacked_bytes'] / 2**20:7.2f} MiB  unpacked, "
      f"{manifest['packed_bytes'] / 2**20:.2f} MiB in .gpu/pack.tar.xz")
PY
  local tree gpu
  read -r tree gpu < <(carried_bytes)
  echo "carried: .gpu $((gpu >> 10)) KiB + the tree $((tree >> 10)) KiB = $(((tree + gpu) >> 10)) KiB" \
    "(at most $MAX_CARRY_MIB MiB)"
  if [ $((tree + gpu)) -gt $((MAX_CARRY_MIB << 20)) ]; then
    echo "too big to carry: .gpu ($((gpu >> 20)) MiB) plus the tree ($((tree >> 20)) MiB) pass" \
      "$MAX_CARRY_MIB MiB, of the device tool's 64 for everything" >&2
    exit 1
  fi
}

TEST_FLAGS=()
case "${1:-}" in
  --pack) pack; exit ;;
  --dry-run) DRY=1; shift; TEST_FLAGS=("$@") ;;
  "") DRY= ;;
  *) echo "usage: scripts/gpu-check.sh [--pack | --dry-run [CARGO TEST FLAGS]]" >&2; exit 2 ;;
esac

OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
rm -f "$OUT"/summary.json "$OUT"/summary.txt "$OUT"/check.log "$OUT"/running.log \
  "$OUT"/gateway.log "$OUT"/results.json
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
MODELS=$WORK/models
mkdir -p "$MODELS" "$WORK/logs" "$WORK/figures"
export RUST_BACKTRACE=1 NO_COLOR=1 GATEWAY_TEST_DATA=$PWD/tests/data
# No progress bars in the logs.
export TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1

if [ -n "$DRY" ]; then
  # Limits for the 2-core CI machine, where the emulator runs the kernels one thread at a time.
  DEADLINE=${GPU_CHECK_DEADLINE:-600}
  LIMITS=(env=20 nvrtc=80 kernels=110 decoder=60 models=80 parity=60 invariance=30 http=60 warm=30
    bench=60)
  TESTS=emu:: SHAPES="tiny=$MODELS/tiny-llama" MAIN=$MODELS/tiny-llama DEVICE=cpu DTYPE=auto
  # The warm section's GPU is the emulator: the test build opens it for `--device cuda`.
  WARM_ENV=ENGINE_TEST_DEVICE=emu
  NEW_TOKENS=12 BENCH="--prefill 64 --decode-tokens 8" PEER="--steps 8 --copy-gib 1"
  # The binaries `cargo test --workspace` built, found without building anything new: the same
  # command, flags and settings as `make test`'s, so it is a no-op after it.
  export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
  BIN=$WORK/bin
  mkdir -p "$BIN"
  cargo test --workspace --no-run "${TEST_FLAGS[@]}" --message-format=json 2>"$WORK/cargo.log" |
    python3 scripts/gpu_check_bins.py "$BIN" --link ||
    { tail -20 "$WORK/cargo.log"; echo "the dry run needs the workspace's test build" >&2; exit 1; }
  PY=${PYTHON:-$(scripts/fetch-torch.sh)} || exit 1
  KCACHE=$WORK/kernels
else
  LIMITS=(env=10 nvrtc=20 kernels=45 decoder=30 models=75 parity=40 invariance=20 http=35 warm=25
    bench=55)
  WARM_ENV=
  TESTS=cuda:: SHAPES="smol=$MODELS/smol 1b=$MODELS/1b" MAIN=$MODELS/1b DEVICE=cuda DTYPE=bfloat16
  NEW_TOKENS=16 BENCH="--prefill 2048 --decode-tokens 64" PEER="--steps 64 --copy-gib 4"
  [ -f .gpu/pack.tar.xz ] || { echo "no .gpu/: run scripts/gpu-check.sh --pack first, here" >&2; exit 2; }
  # The env section unpacks it here.
  BIN=$WORK/pack
  PY=${PYTHON:-python3}
  KCACHE=$BIN/kernels
fi
export GATEWAY_KERNEL_CACHE=$KCACHE
# The device's CUDA libraries, and those of its torch's wheels as a second source; here, only
# the NVRTC `make nvrtc` fetched, the one the pack compiles with.
nv=
[ -n "$DRY" ] || nv=$("$PY" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${nv}:$NVRTC_LIB:${LD_LIBRARY_PATH:-}"

FAILED=0
MODE=device
[ -n "$DRY" ] && MODE="dry-run: the kernels' CPU emulator, the tiny shape, the CPU device; no GPU"
MANIFEST=.gpu/manifest.json
[ -n "$DRY" ] && MANIFEST=
python3 scripts/gpu_check_summary.py start --out "$OUT" --mode "$MODE" --elapsed "$SECONDS" \
  --deadline "$DEADLINE" ${MANIFEST:+--manifest "$MANIFEST"}

limit_of() {
  local kv
  for kv in "${LIMITS[@]}"; do
    [ "${kv%%=*}" = "$1" ] && { echo "${kv#*=}"; return; }
  done
  echo 0
}

# section NAME [optional] COMMAND...: runs COMMAND (a function below or a program) in a fresh
# bash under min(its limit, the time left), its output in $OUT/running.log while it runs, then in
# check.log. Exit 0 is PASS; 77 is SKIP, with the reason as the log's last line (optional
# sections only; a required one that skips has failed); anything else FAIL.
section() {
  local name=$1 optional= limit left verdict rc t0
  shift
  [ "$1" = optional ] && { optional=1; shift; }
  # SECONDS counts from the script's start; 8 s for the kill's grace and the bookkeeping.
  left=$((DEADLINE - SECONDS - 8))
  if [ -n "$optional" ]; then limit=$left; else limit=$(limit_of "$name"); fi
  [ "$limit" -gt "$left" ] && limit=$left
  [ "$limit" -gt 0 ] || limit=0
  t0=$SECONDS
  export FIG=$WORK/figures/$name.json SECTION_LIMIT=$limit
  : >"$WORK/logs/$name.log"
  if [ "$limit" -lt 5 ]; then
    verdict="NOT RUN (no time left of the ${DEADLINE}s deadline)"
    [ -n "$optional" ] && verdict="SKIP (no time left)"
  else
    python3 scripts/gpu_check_summary.py begin --out "$OUT" --name "$name" --limit "$limit"
    echo "=== $name (limit ${limit}s)"
    # A fresh bash, so that a section may be a function below, and the timeout ends all of it;
    # pipefail, so that a program piped into tee fails its section.
    timeout --kill-after=5 "$limit" bash -c 'set -o pipefail; "$@"' _ "$@" >"$OUT/running.log" 2>&1
    rc=$?
    mv "$OUT/running.log" "$WORK/logs/$name.log"
    case $rc in
      0) verdict=PASS ;;
      77) verdict="SKIP ($(tail -n 1 "$WORK/logs/$name.log"))"
          [ -n "$optional" ] || verdict="FAIL (skipped: $(tail -n 1 "$WORK/logs/$name.log"))" ;;
      124|137) verdict="FAIL (timed out after ${limit}s)" ;;
      *) verdict="FAIL (rc $rc)" ;;
    esac
    tail -n 20 "$WORK/logs/$name.log"
  fi
  case $verdict in FAIL*|NOT*) FAILED=1 ;; esac
  {
    echo "=== $name: $verdict in $((SECONDS - t0))s (limit ${limit}s)"
    # A chatty section cannot push the file past what the device tool returns (16 MiB).
    tail -c 2000000 "$WORK/logs/$name.log"
  } >>"$OUT/check.log"
  echo "$name: $verdict in $((SECONDS - t0))s"
  python3 scripts/gpu_check_summary.py end --out "$OUT" --name "$name" --verdict "$verdict" \
    --seconds $((SECONDS - t0)) --limit "$limit" --log "$WORK/logs/$name.log" --figures "$FIG"
}

# figure KEY JSON: a key figure of the running section, for summary.json.
figure() {
  python3 -c 'import json, sys; print(json.dumps({sys.argv[1]: json.loads(sys.argv[2])}))' "$1" "$2" >>"$FIG"
}

# The last JSON object line of a file, or null.
last_json() {
  grep -E '^\{' "$1" | tail -n 1 | grep . || echo null
}

# run_tests BINARY ARGS...: a Rust test binary that must run at least one test and fail none.
run_tests() {
  local log=$WORK/tests.$$.log
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || return "$rc"
  grep -qE 'test result: ok\. [1-9][0-9]* passed' "$log" || { echo "no test ran: $*"; return 1; }
}

# kernels_from_cache LOG: the backend's "CUDA kernels ready" line in LOG says every source came
# from the cache.
kernels_from_cache() {
  local line sources from_cache
  line=$(sed 's/\x1b\[[0-9;]*m//g' "$1" | grep 'CUDA kernels ready' | tail -n 1)
  [ -n "$line" ] || { echo "no \"CUDA kernels ready\" line in $1"; return 1; }
  sources=$(grep -oE 'sources=[0-9]+' <<<"$line" | cut -d= -f2)
  from_cache=$(grep -oE 'from_cache=[0-9]+' <<<"$line" | cut -d= -f2)
  figure kernel_load "{\"sources\": ${sources:-null}, \"from_cache\": ${from_cache:-null}}"
  [ -n "$sources" ] && [ "$sources" = "$from_cache" ] ||
    { echo "the kernels were compiled on the device: $line"; return 1; }
  echo "every kernel from the cache: $from_cache of $sources sources"
}

env_info() {
  local rc=0 b
  if [ -z "$DRY" ]; then
    python3 -c 'import sys, tarfile
with tarfile.open(".gpu/pack.tar.xz") as t:
    t.extractall(sys.argv[1], filter="data")' "$BIN" || { echo "cannot unpack .gpu/pack.tar.xz"; return 1; }
    echo "unpacked .gpu/pack.tar.xz (made $(python3 -c 'import json; m = json.load(open(".gpu/manifest.json"))
print(m["made"], "from", m["commit"])'))"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || rc=1
    figure gpu "\"$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)\""
  fi
  ls /usr/local/cuda/lib64 2>/dev/null | grep -E '^lib(nvrtc|cublas|cublasLt)\.so' || true
  [ -n "$nv" ] && ls "$nv" | grep -E 'nvrtc|cublas' || true
  # The installed versions, without importing torch (seconds on a cold machine): the models
  # section is the one that uses it.
  "$PY" -c 'import json; from importlib.metadata import version
print(json.dumps({p: version(p) for p in ("torch", "transformers")}))' | tee -a "$FIG" || rc=1
  uname -r
  for b in gateway decode_bench kernel_cache gpu_decoder gpu_parity $(cat "$BIN/kernel-tests"); do
    [ -x "$BIN/$b" ] || { echo "missing $BIN/$b"; rc=1; continue; }
    ldd "$BIN/$b" | grep 'not found' && { echo "$b: libraries not found"; rc=1; }
  done
  return $rc
}

kernel_cache() {
  set -e
  if [ -n "$DRY" ]; then
    # No device here: fill a cache with this machine's NVRTC, then check it as the device does
    # (entries, names, entry points), without the load.
    "$BIN/kernel_cache" fill "$KCACHE" --arch sm_90 | tee "$WORK/fill.json"
    "$BIN/kernel_cache" check "$KCACHE" --arch sm_90 | tee -a "$FIG"
    figure note '"dry run: filled with this machine'"'"'s NVRTC and checked; no device loaded it"'
    echo "dry run: checked the cache's entries; no device to load them into"
  else
    "$BIN/kernel_cache" check "$KCACHE" --device 0 2>&1 | tee "$WORK/check.out"
    last_json "$WORK/check.out" >>"$FIG"
    kernels_from_cache "$WORK/check.out"
  fi
}

kernel_tests() {
  local rc=0 t
  for t in $(cat "$BIN/kernel-tests"); do
    GATEWAY_CUDA_SYNC=1 run_tests "$BIN/$t" --include-ignored --test-threads 1 "$TESTS" || rc=1
  done
  return $rc
}

decoder() {
  GATEWAY_CUDA_SYNC=1 run_tests "$BIN/gpu_decoder" --include-ignored --test-threads 1 "${TESTS}tiny"
}

models() {
  set -e
  # shellcheck disable=SC2086
  "$PY" scripts/gpu_reference.py prepare $SHAPES --prompts 5 --new-tokens "$NEW_TOKENS" |
    tee "$WORK/models.out"
  python3 -c '
import json, sys
made = {}
for line in open(sys.argv[1]):
    m = json.loads(line)
    key = m.get("made") or m.get("reference", "").rsplit("/", 1)[0]
    made.setdefault(key.rsplit("/", 1)[-1], {}).update(
        {k: v for k, v in m.items() if k in ("initialised_on", "parameters", "device")} |
        ({"make_s": m["seconds"]} if "made" in m else {"reference_s": m["seconds"]}))
print(json.dumps({"models": made}))' "$WORK/models.out" | tee -a "$FIG"
}

parity() {
  if [ -n "$DRY" ]; then
    # The emulator's parity tests, on the folder the models section just made with transformers
    # (it is what they read from the test data, `tiny-llama`).
    GATEWAY_TEST_DATA=$MODELS run_tests "$BIN/gpu_parity" --nocapture tiny_llama
  else
    GPU_PARITY_DIR=$(for s in $SHAPES; do printf '%s:' "${s#*=}"; done) \
      run_tests "$BIN/gpu_parity" --include-ignored --nocapture transformers_parity_on_the_gpu
  fi
}

# The invariance tests print one "bit-identical" line per model run; a figure counts them.
invariance() {
  local out=$WORK/invariance.out rc
  if [ -n "$DRY" ]; then
    # The emulator's check, on the folder the models section made (as the parity section).
    GATEWAY_TEST_DATA=$MODELS run_tests "$BIN/gpu_parity" --nocapture \
      batch_invariance_on_the_emulator 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
  else
    run_tests "$BIN/gpu_decoder" --include-ignored --test-threads 1 --nocapture \
      cuda::batch_invariance cuda::sampling_does_not_depend 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then
      GPU_PARITY_DIR=$(for s in $SHAPES; do printf '%s:' "${s#*=}"; done) \
        run_tests "$BIN/gpu_parity" --include-ignored --nocapture batch_invariance_on_the_gpu \
        2>&1 | tee -a "$out"
      rc=${PIPESTATUS[0]}
    fi
  fi
  figure invariance "{\"bit_identical_runs\": $(grep -c 'bit-identical' "$out")}"
  return "$rc"
}

bench() {
  set -e
  # shellcheck disable=SC2086
  "$BIN/decode_bench" --model "$MAIN" --device "$DEVICE" --dtype "$DTYPE" --threads "$(nproc)" \
    --batches 1,32 $BENCH | tee "$WORK/bench.json"
  # shellcheck disable=SC2086
  "$PY" scripts/gpu_reference.py time --model "$MAIN" --out "$WORK/peer.json" $PEER
  python3 - "$WORK" "$MAIN" "$OUT/results.json" <<'PY' | tee -a "$FIG"
import json, os, sys
work, model, results = sys.argv[1:]
ours = json.loads(open(os.path.join(work, "bench.json")).read().strip().splitlines()[-1])
peer = json.load(open(os.path.join(work, "peer.json")))
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
eager = peer["transformers_eager_decode_b1_step_ms"]
res["b1"]["transformers_eager_ms"] = eager
res["b1"]["vs_transformers"] = round(eager / res["b1"]["step_ms"], 2) if res["b1"]["step_ms"] else None
json.dump(res, open(results, "w"), indent=1)
print(json.dumps({"bench": {k: res[k] for k in ("b1", "b32")}}))
PY
}

http() {
  local port=8765 pid rc
  "$BIN/gateway" serve --model "$MAIN" --served-model-name gpu-check --device "$DEVICE" \
    --port "$port" --max-model-len 1024 >"$OUT/gateway.log" 2>&1 &
  pid=$!
  # The log is written where it comes back from, in case the run is killed; a runaway one is cut
  # to what the device tool returns.
  # shellcheck disable=SC2064
  trap "kill $pid 2>/dev/null; truncate -s '<8M' '$OUT/gateway.log'" EXIT
  for _ in $(seq 120); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" \
      >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { echo "the gateway exited"; tail -30 "$OUT/gateway.log"; return 1; }
    sleep 0.5
  done
  python3 scripts/gpu_http_check.py --base-url "http://127.0.0.1:$port" --model gpu-check \
    --streams 32 --expect-device "$DEVICE" | tee "$WORK/http.out"
  rc=${PIPESTATUS[0]}
  grep -F '"concurrent_streams"' "$WORK/http.out" | tail -n 1 >>"$FIG"
  kill -TERM "$pid"
  wait "$pid"
  grep -E 'CUDA|KV cache|weights|device' "$OUT/gateway.log" | head -20
  if [ -z "$DRY" ]; then
    kernels_from_cache "$OUT/gateway.log" || rc=1
  else
    figure note '"dry run: the CPU device serves; no kernel load to check"'
    echo "dry run: the CPU device loads no kernels"
  fi
  return $rc
}

# up_in SECONDS_LIMIT PORT PID LOG: waits for /health on PORT to answer 200; prints the seconds
# it took (from the caller's T0) or fails naming the log when the process exits or time runs out.
up_in() {
  local limit=$1 port=$2 pid=$3 log=$4 i
  for i in $(seq $((limit * 10))); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" \
      >/dev/null 2>&1 && { python3 -c "import time; print(round(time.time() - $T0, 2))"; return 0; }
    kill -0 "$pid" 2>/dev/null || { echo "exited: $(tail -5 "$log")" >&2; return 1; }
    sleep 0.1
  done
  echo "not up within ${limit}s: $(tail -5 "$log")" >&2
  return 1
}

# A greedy completion with logprobs from the server on PORT, as one JSON line.
greedy() {
  python3 - "$1" <<'PY'
import json, sys, urllib.request as u
body = {"model": "gpu-check", "prompt": "The capital of France is", "max_tokens": 8,
        "temperature": 0, "ignore_eos": True, "logprobs": 2}
r = u.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", json.dumps(body).encode(),
              {"content-type": "application/json"})
c = json.load(u.urlopen(r, timeout=60))["choices"][0]
print(json.dumps({"text": c["text"], "logprobs": c["logprobs"]}, sort_keys=True))
PY
}

# A warm restart through the GPU weight cache against a cold start, on the device (in the dry
# run on the emulator, which the test build opens for `--device cuda`).
warm() {
  local port=8766 hport=8767 sock=$WORK/weight-cache pids=() cold preload warm_s rc=0
  local common=(--model "$MAIN" --served-model-name gpu-check --device cuda --dtype "$DTYPE"
    --max-model-len 1024 --kv-cache-tokens 4096 --max-num-batched-tokens 256)
  # shellcheck disable=SC2064
  trap 'kill "${pids[@]}" 2>/dev/null' EXIT
  T0=$(date +%s.%N)
  env $WARM_ENV "$BIN/gateway" serve "${common[@]}" --port "$port" >"$WORK/cold.log" 2>&1 &
  pids+=($!)
  cold=$(up_in 60 "$port" $! "$WORK/cold.log") || return 1
  greedy "$port" >"$WORK/cold.json" || return 1
  kill -TERM "${pids[-1]}"; wait "${pids[-1]}"
  T0=$(date +%s.%N)
  env $WARM_ENV "$BIN/gateway" preload --model "$MAIN" --served-model-name gpu-check --device cuda \
    --dtype "$DTYPE" --weight-cache-socket-dir "$sock" --weight-cache-health-port "$hport" \
    >"$WORK/preload.log" 2>&1 &
  pids+=($!)
  preload=$(up_in 60 "$hport" $! "$WORK/preload.log") || return 1
  T0=$(date +%s.%N)
  env $WARM_ENV "$BIN/gateway" serve "${common[@]}" --port "$port" --load-format ipc_cache \
    --model-loader-extra-config "{\"fallback\": false, \"socket_dir\": \"$sock\"}" \
    >"$WORK/warm.log" 2>&1 &
  pids+=($!)
  warm_s=$(up_in 60 "$port" $! "$WORK/warm.log") || return 1
  greedy "$port" >"$WORK/warm.json" || return 1
  grep -hE 'weights from|device weights mapped|weights on the GPU|weight cache ready' \
    "$WORK/preload.log" "$WORK/warm.log" | sed 's/\x1b\[[0-9;]*m//g' | cut -c 1-300
  local mapped=false same=false
  grep -q 'device weights mapped from the weight cache' "$WORK/warm.log" && mapped=true
  cmp -s "$WORK/cold.json" "$WORK/warm.json" && same=true
  figure warm_restart "{\"cold_s\": $cold, \"preload_s\": $preload, \"warm_s\": $warm_s,
    \"mapped\": $mapped, \"same_output\": $same}"
  echo "cold start ${cold}s, preload ${preload}s, warm start ${warm_s}s (mapped: $mapped, same output: $same)"
  [ "$mapped" = true ] || { echo "the warm start did not map the cached device weights"; rc=1; }
  [ "$same" = true ] || { echo "warm and cold answers differ:"; cat "$WORK/cold.json" "$WORK/warm.json"; rc=1; }
  kill -TERM "${pids[@]}" 2>/dev/null
  wait
  return $rc
}

# Races and bad accesses that the emulator cannot see (it runs a block's threads one at a time
# between barriers), with the time the deadline leaves: each run gets what remains, and the
# section says how many ran.
sanitize() {
  local cs rc=0 ran=0 runs=() t0=$SECONDS r left out
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  [ -n "$cs" ] || { echo "not supported on this machine: no compute-sanitizer"; return 77; }
  for t in $(cat "$BIN/kernel-tests"); do runs+=("racecheck $t cuda::"); done
  runs+=("memcheck gpu_decoder cuda::tiny_vl_f32")
  out=$WORK/sanitize.out
  for r in "${runs[@]}"; do
    set -- $r
    left=$((SECTION_LIMIT - (SECONDS - t0) - 2))
    [ "$left" -ge 5 ] || break
    timeout "$left" "$cs" --tool "$1" --error-exitcode 9 "$BIN/$2" --include-ignored --test-threads 1 "$3" \
      >"$out" 2>&1
    local code=$?
    cat "$out"
    if grep -qE 'Device not supported|error 999|CUDA_ERROR_UNKNOWN' "$out"; then
      echo "not supported on this machine: compute-sanitizer cannot attach to the device"
      return 77
    fi
    [ $code -eq 124 ] && break
    ran=$((ran + 1))
    [ $code -eq 0 ] || { echo "FAIL $r (rc $code)"; rc=1; }
  done
  figure sanitize "{\"runs\": ${#runs[@]}, \"finished\": $ran}"
  [ $rc -eq 0 ] || return 1
  if [ "$ran" -lt "${#runs[@]}" ]; then
    echo "the time ran out: $ran of ${#runs[@]} runs finished clean"
    return 77
  fi
}

export WARM_ENV DRY PY TESTS SHAPES MAIN DEVICE DTYPE BENCH PEER NEW_TOKENS OUT WORK MODELS BIN KCACHE nv
export -f figure last_json run_tests kernels_from_cache env_info kernel_cache kernel_tests decoder \
  models parity invariance bench http up_in greedy warm sanitize

section env env_info
section nvrtc kernel_cache
section kernels kernel_tests
section decoder decoder
section models models
section parity parity
section invariance invariance
section http http
section warm warm
section bench bench
section sanitize optional sanitize

python3 scripts/gpu_check_summary.py finish --out "$OUT"
rm -rf "$WORK"
exit $FAILED
