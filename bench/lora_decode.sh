#!/usr/bin/env bash
# What LoRA adapters cost in a decode step: a batch mixing two rank-16 adapters and the base
# (a third of the rows each) against the same batch on the base alone, steps interleaved in
# rounds (engine/examples/lora_decode_bench.rs). Release build; prints one JSON line per run.
#
#   bench/lora_decode.sh [RUNS] [-- EXTRA ARGS: --threads N --batch B --steps S --rounds R --model PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
shift $(( $# > 0 ? 1 : 0 ))
[ "${1:-}" = "--" ] && shift
export CARGO_INCREMENTAL=0
cargo build --release -p engine --example lora_decode_bench >&2
for _ in $(seq "$runs"); do
  target/release/examples/lora_decode_bench --threads 2 "$@"
done
