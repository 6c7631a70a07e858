#!/usr/bin/env python3
"""Tiny GGUF files of the families whose GGUF layout differs from Llama's (Gemma 2, Gemma 3,
Phi-3), made by llama.cpp's own converter, and llama.cpp's answers on them, for
`engine/tests/gguf_families.rs`:

    python scripts/make_tiny_gguf.py    # writes tests/data/tiny-gguf/

Needs torch, transformers, sentencepiece and protobuf, the llama.cpp sources vendored in the
llama-cpp-python 0.3.36 sdist (LLAMA_CPP_SRC) and a static build of them (LLAMA_CPP_BUILD,
as the K-quant scripts make it: `cmake --build BUILD --target llama-quantize` builds the
libraries); by default both under models-cache/llama-cpp.

1. Vocabularies of 512 entries trained on a fixed pseudo-text: SentencePiece BPE (byte
   fallback; Gemma's special tokens and no dummy prefix, or Phi-3's), for `llama` tokenizers,
   and a byte-level BPE (Llama 3's special tokens) for `gpt2` ones under Qwen2's split.
2. Random bf16 checkpoints with transformers (fixed seeds, random norm weights): Llama 3.x
   (`llama3` RoPE scaling, written as `rope_freqs`; Q/K permuted by the converter), Qwen2
   (Q/K/V biases), Qwen3 (Q/K norms, tied head), Gemma 2 (4 layers, 12-token window, soft-capping 4 and 6), Gemma 3 text (6
   layers: llama.cpp's default pattern of five sliding layers and one global, local RoPE base
   100, linear scaling 4 on the global layer), Phi-3 (fused qkv and gate_up; once more with
   LongRoPE, pretrained context 32, served 128). Their
   `query_pre_attn_scalar` is the head dim, as llama.cpp assumes for these sizes.
3. `convert_hf_to_gguf.py --outtype f32` for each (with bf16 weights llama.cpp rounds the
   activations to bf16 too, which would hide what the comparison is for).
4. `reference.json`: for each file, llama.cpp's top-5 logprobs at every position of a fixed
   48-token prompt (scripts/llamacpp_reference.cpp, one thread) and transformers' float32 ones
   on the same weights; and llama.cpp's tokenisation of a set of texts.
"""

import glob
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import sentencepiece as spm
import torch
import transformers

from tiny_top5 import made_by, top5

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "data", "tiny-gguf")
CACHE = os.path.join(ROOT, "models-cache", "llama-cpp")
SRC = os.environ.get("LLAMA_CPP_SRC") or glob.glob(
    os.path.join(CACHE, "llama_cpp_python-*", "vendor", "llama.cpp"))[0]
BUILD = os.environ.get("LLAMA_CPP_BUILD", os.path.join(CACHE, "build"))
VOCAB = 512
PROMPT = [(i * 37 + 11) % 500 + 6 for i in range(48)]
WORDS = ("the of and to in is was for on that with as by at from his her they this which "
         "model token window rotary layer attention gemma phi llama cache sliding prefix "
         "server request answer number value river mountain city garden winter summer "
         "quick brown fox jumps over lazy dog café naïve über straße 東京 数字 😀").split()
TEXTS = [
    "Hello world",
    "the quick brown fox jumps over the lazy dog",
    "  two leading spaces and  double  spaces ",
    "unseen glyphs: ₿ ☃ and 東京 with é",
    "numbers 12345 and 3.14159",
    "tabs\tand\nnewlines\n\n",
]
TEMPLATES = {
    "bpe": "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
           "\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
           "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
    "gemma": "{{ bos_token }}{% for m in messages %}<start_of_turn>"
             "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
             "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
             "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
    "phi3": "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
}
CHATS = {
    "bpe": ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"],
    "gemma": ["<start_of_turn>user\nWhat is the cache?<end_of_turn>\n<start_of_turn>model\n"],
    "phi3": ["<|user|>\nWhat is the cache?<|end|>\n<|assistant|>\n", "<|end|>  spaces after"],
}


def corpus():
    rng = random.Random(7)
    for _ in range(3000):
        n = rng.randint(3, 14)
        words = [rng.choice(WORDS) for _ in range(n)]
        line = " ".join(words)
        if rng.random() < 0.3:
            line += f" {rng.randint(0, 99999)}"
        yield line.capitalize() + rng.choice([".", "?", "!", ","])


GEMMA_VOCAB = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>",
                   eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
                   user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
                   add_dummy_prefix=False)
# Llama 2's pieces and Phi-3's chat tokens: llama.cpp's Phi-3 vocabulary handling looks them up.
PHI3_VOCAB = dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                  user_defined_symbols=["<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"],
                  add_dummy_prefix=True)


BPE_SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]


def train_bpe(folder):
    """A byte-level BPE (GPT-2 style, 512 entries with its special tokens) as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=BPE_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(list(corpus()), trainer)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": BPE_SPECIALS[0], "eos_token": BPE_SPECIALS[1],
                   "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATES["bpe"]},
                  f)


def train_vocab(folder, kind):
    spm.SentencePieceTrainer.train(
        sentence_iterator=corpus(), model_prefix=os.path.join(folder, "tokenizer"),
        model_type="bpe", vocab_size=VOCAB, byte_fallback=True, character_coverage=1.0,
        remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True,
        normalization_rule_name="identity", num_threads=1, minloglevel=2, **kind)
    os.remove(os.path.join(folder, "tokenizer.vocab"))


COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
              rms_norm_eps=1e-6, bos_token_id=2, eos_token_id=1, pad_token_id=0,
              initializer_range=0.2)


def families():
    # Byte-level BPE files under Llama 3's or Qwen's split (the converter is told its name:
    # it only knows real vocabularies by their hash).
    bpe = dict(COMMON, bos_token_id=0, eos_token_id=1, pad_token_id=None)
    bpe.pop("head_dim")
    yield "llama3", "bpe", 18, transformers.LlamaForCausalLM, transformers.LlamaConfig(
        num_hidden_layers=2, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64}, **bpe)
    yield "qwen2", "bpe", 16, transformers.Qwen2ForCausalLM, transformers.Qwen2Config(
        num_hidden_layers=2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **bpe)
    yield "qwen3", "bpe", 17, transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
        num_hidden_layers=2, head_dim=16, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **bpe)
    yield "gemma2", "gemma", 11, transformers.Gemma2ForCausalLM, transformers.Gemma2Config(
        num_hidden_layers=4, sliding_window=12, query_pre_attn_scalar=16,
        attn_logit_softcapping=4.0, final_logit_softcapping=6.0, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **COMMON)
    yield "gemma3", "gemma", 12, transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(
        num_hidden_layers=6, sliding_window=12, query_pre_attn_scalar=16,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
        },
        tie_word_embeddings=True, **COMMON)
    phi = dict(COMMON, bos_token_id=1, eos_token_id=2, pad_token_id=None)
    phi.pop("head_dim")
    yield "phi3", "phi3", 13, transformers.Phi3ForCausalLM, transformers.Phi3Config(
        num_hidden_layers=2, original_max_position_embeddings=2048, sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, **phi)
    # Phi-3.5's LongRoPE: pretrained on 32 positions, served on 128, so the 48-token prompt
    # takes the long factors in llama.cpp (its context is 64), transformers and the engine.
    gen = torch.Generator().manual_seed(14)
    factors = lambda hi: [round(1.0 + (hi - 1.0) * float(x), 4) for x in torch.rand(8, generator=gen)]
    yield "phi3-longrope", "phi3", 15, transformers.Phi3ForCausalLM, transformers.Phi3Config(
        num_hidden_layers=2, original_max_position_embeddings=32, sliding_window=None,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "short_factor": factors(2.0), "long_factor": factors(8.0)},
        tie_word_embeddings=False, **dict(phi, max_position_embeddings=128))


def build_tool(work):
    exe = os.path.join(work, "llamacpp_reference")
    libs = []
    for name in ("libllama.a", "libggml.a", "libggml-cpu.a", "libggml-base.a"):
        found = glob.glob(os.path.join(BUILD, "**", name), recursive=True)
        if not found:
            sys.exit(f"{name} not found under {BUILD}: build llama.cpp first")
        libs.append(found[0])
    subprocess.run(
        ["g++", "-O2", "-std=c++17", os.path.join(ROOT, "scripts", "llamacpp_reference.cpp"),
         "-I", os.path.join(SRC, "include"), "-I", os.path.join(SRC, "ggml", "include"),
         "-o", exe, *libs, "-fopenmp", "-lpthread", "-ldl"], check=True)
    return exe


def main():
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="tiny-gguf-")
    tool = build_tool(work)
    vocabs = {}
    for kind, spec in (("gemma", GEMMA_VOCAB), ("phi3", PHI3_VOCAB)):
        vocabs[kind] = os.path.join(work, f"vocab-{kind}")
        os.makedirs(vocabs[kind])
        train_vocab(vocabs[kind], spec)
    vocabs["bpe"] = os.path.join(work, "vocab-bpe")
    os.makedirs(vocabs["bpe"])
    train_bpe(vocabs["bpe"])
    os.makedirs(OUT, exist_ok=True)
    reference = {
        "made_by": made_by("scripts/make_tiny_gguf.py",
                           "llama.cpp from llama-cpp-python 0.3.36, CPU, one thread; "
                           "transformers float32 on the same (bf16-representable) weights"),
        "prompt_ids": PROMPT,
        "files": {},
    }
    for name, kind, seed, cls, config in families():
        torch.manual_seed(seed)
        hf = os.path.join(work, name)
        model = cls(config)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 1:
                    p.normal_(0.0, 0.3)
        model = model.to(torch.bfloat16).eval()
        model.save_pretrained(hf)
        gguf = os.path.join(OUT, f"{name}.gguf")
        convert = [os.path.join(SRC, "convert_hf_to_gguf.py"), hf, "--outfile", gguf,
                   "--outtype", "f32"]
        if kind == "bpe":
            for f in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(os.path.join(vocabs["bpe"], f), hf)
            # The tokenizer as its file says (transformers would pick Qwen2Tokenizer by the
            # model type, which adds a token).
            code = ("import os, sys, runpy, transformers; sys.path.insert(0, sys.argv[1]); "
                    "pre = sys.argv.pop(); sys.argv = sys.argv[2:]; import conversion.base as b; "
                    "b.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre; "
                    "transformers.AutoTokenizer.from_pretrained = lambda d, *a, **k: "
                    "transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(str(d), "
                    "'tokenizer.json'), bos_token='<|begin_of_text|>', eos_token='<|eot_id|>'); "
                    "runpy.run_path(sys.argv[0], run_name='__main__')")
            pre = "llama-bpe" if name == "llama3" else "qwen2"
            command = [sys.executable, "-c", code, SRC, *convert, pre]
        else:
            shutil.copy(os.path.join(vocabs[kind], "tokenizer.model"), hf)
            bos, eos = ("<bos>", "<eos>") if kind == "gemma" else ("<s>", "</s>")
            with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
                json.dump({"add_bos_token": True, "add_eos_token": False, "bos_token": bos,
                           "eos_token": eos, "unk_token": "<unk>",
                           "tokenizer_class": "LlamaTokenizer",
                           "chat_template": TEMPLATES[kind]},
                          f)
            command = [sys.executable, *convert]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ids = ",".join(str(i) for i in PROMPT)
        llama = json.loads(subprocess.run([tool, gguf, "logprobs", ids], check=True,
                                          capture_output=True, text=True).stdout)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            hf, dtype=torch.float32, attn_implementation="eager").eval()
        tokenized = {t: json.loads(subprocess.run([tool, gguf, "tokenize", t], check=True,
                                                  capture_output=True, text=True).stdout)["ids"]
                     for t in TEXTS + CHATS[kind]}
        reference["files"][f"{name}.gguf"] = {
            "llama_cpp_top5": llama["top5"],
            "transformers_top5": top5(model, PROMPT),
            "llama_cpp_tokens": tokenized,
        }
        print("wrote", gguf, os.path.getsize(gguf), "bytes")
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1, ensure_ascii=False)
        f.write("\n")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
