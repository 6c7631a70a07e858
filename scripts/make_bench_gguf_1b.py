#!/usr/bin/env python3
"""The Python steps of scripts/make-bench-gguf-1b.sh (run with models-cache/torch-venv's
Python; the shell script says what the files are for):

    make_bench_gguf_1b.py hf HF_DIR             # bench/families.py's Llama-3.2-1B folder
    make_bench_gguf_1b.py folder HF_DIR DIR     # its weights with a vocabulary llama.cpp loads
    make_bench_gguf_1b.py convert DIR OUT.gguf  # llama.cpp's convert_hf_to_gguf.py, bf16
    make_bench_gguf_1b.py mix FILE.gguf...      # size and tensor types by bytes, a JSON line each

`hf` writes the folder only if it has no config.json (bench/families.py's `make`: torch seed
0, matrices N(0, 0.02) in bf16, norms 1.0, tests/data/tiny-llama's tokenizer).

`folder` makes DIR: model.safetensors a relative symlink to HF_DIR's, config.json HF_DIR's
with the BOS/EOS ids set to the tokenizer's, and the byte-level BPE that
scripts/make_tiny_gguf.py trains for its Llama 3 file (512 ids with Llama 3's special tokens,
trained on a fixed pseudo-text, seed 7). HF_DIR's own tokenizer (tests/data/tiny-llama's) has
no merges, and llama.cpp refuses a BPE vocabulary without them ("cannot find tokenizer merges
in model file"); no real vocabulary is here offline in HF form (SmolLM2's is only inside its
GGUF).

`convert` runs the converter of the pinned llama.cpp tree (LLAMA_CPP_SRC, default the one
vendored in models-cache/llama-cpp/llama_cpp_python-*), with two things told to it:
- the pre-tokenizer is `llama-bpe` (Llama 3's split), as scripts/make_tiny_gguf.py does: the
  converter knows real vocabularies only by a hash. It pads the vocabulary to the config's
  128256 ids with unused `[PADn]` entries, so token_embd keeps Llama-3.2-1B's shape.
  Benchmarks feed token ids.
- `lm_head.weight` is dropped when config.json says `tie_word_embeddings`, so the file is tied
  as Llama-3.2-1B's own GGUFs are (no output.weight; llama-quantize then gives token_embd the
  output matrix's type, Q6_K in these mixes). families.py's folder holds a separate lm_head
  with different values although its config ties them (`to_empty` unties, then each is
  filled); the engine reads that folder as tied, transformers 5.17 as untied (it warns and
  keeps the file's lm_head). The converter would write it as output.weight.
"""

import json
import os
import runpy
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CACHE = os.path.join(ROOT, "models-cache", "llama-cpp")


def llama_src():
    src = os.environ.get("LLAMA_CPP_SRC")
    if src:
        return src
    import glob
    found = sorted(glob.glob(os.path.join(CACHE, "llama_cpp_python-*", "vendor", "llama.cpp")))
    if not found:
        sys.exit(f"no llama.cpp sources under {CACHE}: run scripts/make-llamacpp-quants.sh first")
    return found[-1]


def hf(folder):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import families
    families.make("llama-3.2-1b", folder)


def folder(hf_dir, out):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_tiny_gguf
    os.makedirs(out, exist_ok=True)
    make_tiny_gguf.train_bpe(out)
    with open(os.path.join(out, "tokenizer.json")) as f:
        added = {t["content"]: t["id"] for t in json.load(f)["added_tokens"]}
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    config["bos_token_id"] = added["<|begin_of_text|>"]
    config["eos_token_id"] = added["<|eot_id|>"]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    link = os.path.join(out, "model.safetensors")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.relpath(os.path.join(hf_dir, "model.safetensors"), out), link)


def convert(folder, out):
    src = llama_src()
    sys.path.insert(0, src)
    sys.path.insert(1, os.path.join(src, "gguf-py"))
    import transformers
    import conversion.base as base
    import conversion.llama as llama

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "llama-bpe"
    transformers.AutoTokenizer.from_pretrained = lambda d, *a, **k: \
        transformers.PreTrainedTokenizerFast(
            tokenizer_file=os.path.join(str(d), "tokenizer.json"),
            bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    with open(os.path.join(folder, "config.json")) as f:
        tied = json.load(f).get("tie_word_embeddings", False)
    if tied:
        inner = llama.LlamaModel.filter_tensors.__func__

        def drop_head(cls, item):
            return None if item[0] == "lm_head.weight" else inner(cls, item)
        llama.LlamaModel.filter_tensors = classmethod(drop_head)
    sys.argv = [os.path.join(src, "convert_hf_to_gguf.py"), folder, "--outfile", out,
                "--outtype", "bf16"]
    runpy.run_path(sys.argv[0], run_name="__main__")


def mix(paths):
    sys.path.insert(0, os.path.join(llama_src(), "gguf-py"))
    from gguf import GGUFReader
    for path in paths:
        r = GGUFReader(path)
        by_type = {}
        for t in r.tensors:
            name = t.tensor_type.name
            by_type[name] = by_type.get(name, 0) + int(t.n_bytes)
        total = sum(by_type.values())
        types = {k: {"bytes": v, "share": round(v / total, 4)}
                 for k, v in sorted(by_type.items(), key=lambda kv: -kv[1])}
        layer0 = {t.name.split(".", 2)[2]: t.tensor_type.name for t in r.tensors
                  if t.name.startswith("blk.0.")}
        print(json.dumps({"file": os.path.basename(path), "file_bytes": os.path.getsize(path),
                          "tensor_bytes": total, "tensors": len(r.tensors), "types": types,
                          "token_embd": next(t.tensor_type.name for t in r.tensors
                                             if t.name == "token_embd.weight"),
                          "has_output_weight": any(t.name == "output.weight" for t in r.tensors),
                          "blk.0": layer0}), flush=True)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "hf":
        hf(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "folder":
        folder(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "convert":
        convert(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 3 and sys.argv[1] == "mix":
        mix(sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
