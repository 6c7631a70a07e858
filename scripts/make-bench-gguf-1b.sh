#!/usr/bin/env bash
# GGUF files of a 1B-class Llama-3.2-shaped random checkpoint, for the BENCHMARKS row that sets
# the engine's decode (batch 1) and prefill (512 tokens) tokens/s against llama-bench on the
# same file (issue 26), made the way such files are made in the wild: llama.cpp's
# convert_hf_to_gguf.py, then llama-quantize.
#
#   scripts/make-bench-gguf-1b.sh     # prints one JSON line per file: size and type mix
#
# Shapes: Llama-3.2-1B (hidden 2048, 16 layers, 32 heads / 8 KV heads of 64, FFN 8192, vocab
# 128256, tied embeddings, llama3 RoPE scaling). Weights: bench/families.py's random bf16
# folder (torch seed 0, N(0, 0.02), norms 1.0), reused if there. Tokenizer: the 512-id
# byte-level BPE (Llama 3's special tokens) that scripts/make_tiny_gguf.py trains, converted
# under Llama 3's `llama-bpe` split and padded to 128256 ids; the benchmarks feed token ids.
# scripts/make_bench_gguf_1b.py says why, and how the converter is run.
#
# Writes (5.1 GB besides the 3.0 GB HF folder):
#   $cache/bench-families/llama-3.2-1b/                  HF folder (bench/families.py's)
#   $cache/bench-gguf-1b/hf/                             its weights (symlinked), the BPE vocabulary
#   $cache/bench-gguf-1b/llama-3.2-1b-shape.BF16.gguf    converted, bf16 (2.5 GB)
#   $cache/bench-gguf-1b/llama-3.2-1b-shape.<TYPE>.gguf  llama-quantize BF16 -> TYPE, 2 threads,
#                                                        no imatrix: Q4_K_M (0.80 GB),
#                                                        Q6_K (1.02 GB), IQ4_XS (0.74 GB)
#   $cache/bench-gguf-1b/convert.log, <TYPE>.quantize.log
# Each file is made only if absent (written under a .part name, then renamed). On 2 busy cores
# (2026-12-06): conversion 27 s, Q4_K_M 125 s, Q6_K 73 s, IQ4_XS 297 s, the type mix 25 s;
# 9 min 12 s in all with the HF folder already there (bench/families.py writes it otherwise).
#
# Needs models-cache/torch-venv (scripts/fetch-torch.sh) and the llama.cpp sources and
# llama-quantize that scripts/make-llamacpp-quants.sh fetches and builds. Time them with e.g.
#   models-cache/llama-cpp/build/bin/llama-bench -m FILE -t 2 -p 512 -n 128
#   target/release/examples/decode_bench --model FILE --threads 2 --batches 1 --prefill 512
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${MODELS_CACHE:-models-cache}"
python="$cache/torch-venv/bin/python"
quantize="${LLAMA_QUANTIZE:-$cache/llama-cpp/build/bin/llama-quantize}"
hf="${BENCH_HF_DIR:-$cache/bench-families/llama-3.2-1b}"
out="$cache/bench-gguf-1b"
stem="$out/llama-3.2-1b-shape"
types="Q4_K_M Q6_K IQ4_XS"

[ -x "$python" ] || { echo "$python is missing: run scripts/fetch-torch.sh" >&2; exit 1; }
[ -x "$quantize" ] || { echo "$quantize is missing: run scripts/make-llamacpp-quants.sh" >&2; exit 1; }
mkdir -p "$out"
export OMP_NUM_THREADS=2
# The vocabulary step (scripts/make_tiny_gguf.py) reads SentencePiece models; the torch venv
# does not come with the package.
"$python" -c "import sentencepiece" 2>/dev/null \
  || "$python" -m pip install --quiet --disable-pip-version-check sentencepiece==0.2.3 >&2

if [ ! -f "$hf/config.json" ]; then
  echo "writing the HF checkpoint $hf" >&2
  "$python" scripts/make_bench_gguf_1b.py hf "$hf"
fi

if [ ! -L "$out/hf/model.safetensors" ]; then
  "$python" scripts/make_bench_gguf_1b.py folder "$hf" "$out/hf"
fi

if [ ! -f "$stem.BF16.gguf" ]; then
  echo "converting $out/hf to $stem.BF16.gguf" >&2
  "$python" scripts/make_bench_gguf_1b.py convert "$out/hf" "$stem.BF16.gguf.part" >"$out/convert.log" 2>&1 \
    || { tail -20 "$out/convert.log" >&2; exit 1; }
  mv "$stem.BF16.gguf.part" "$stem.BF16.gguf"
fi

for t in $types; do
  gguf="$stem.$t.gguf"
  if [ ! -f "$gguf" ]; then
    echo "quantising to $t" >&2
    "$quantize" "$stem.BF16.gguf" "$gguf.part" "$t" 2 >"$out/$t.quantize.log" 2>&1 \
      || { tail -20 "$out/$t.quantize.log" >&2; exit 1; }
    mv "$gguf.part" "$gguf"
  fi
done

files=("$stem.BF16.gguf")
for t in $types; do files+=("$stem.$t.gguf"); done
"$python" scripts/make_bench_gguf_1b.py mix "${files[@]}"
