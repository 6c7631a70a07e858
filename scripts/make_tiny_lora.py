#!/usr/bin/env python3
"""Small random PEFT LoRA adapters on the tiny checkpoints, and transformers+peft's greedy
references, for `engine/tests/lora_parity.rs` and the gateway's LoRA tests:

    models-cache/torch-venv/bin/python scripts/make_tiny_lora.py

Writes (each an `adapter_config.json` and `adapter_model.safetensors`, float32):
- `tests/data/tiny-llama-lora-a/`: rank 8, alpha 16, q/v/down projections;
- `tests/data/tiny-llama-lora-b/`: rank 16, alpha 32, `use_rslora`, q/k/o/gate/up projections;
- `tests/data/tiny-phi3-lora/`: rank 8 on Phi-3's fused `qkv_proj` and `gate_up_proj` and on
  `o_proj` / `down_proj`;
- `tests/data/tiny-gemma2-lora/`: rank 8 on Gemma 2's q, o, gate and down projections (its
  outputs are normed before the residual adds);
and `tests/data/tiny-llama-lora-a/reference.json`: for the base (`tiny-llama`), each tiny-llama
adapter and the Phi-3 one, greedy continuations of a few prompts in float32 with the top-5
logprobs and the top-2 margin of every step.

It also converts `tiny-llama` with llama.cpp's `convert_hf_to_gguf.py` (bf16, the checkpoint's
own type) to `tests/data/tiny-llama-gguf/tiny-llama.bf16.gguf`: the converter permutes Llama's
Q/K rows, so the same references check that adapters land on the permuted rows. The converter
comes from the llama.cpp sources vendored in llama-cpp-python's sdist (LLAMA_CPP_SRC, default
under models-cache/llama-cpp, as for scripts/make_tiny_gguf.py).

PEFT initialises `lora_B` to zero, which would make an adapter a no-op and a parity test unable
to fail: both factors are drawn at random here instead. Deterministic: fixed seeds, one thread.
"""

import glob
import json
import os
import subprocess
import sys

import peft
import torch
import transformers

from tiny_top5 import made_by

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(ROOT, "tests", "data")
PROMPTS = [[975, 411, 906, 65, 56], [(i * 37 + 11) % 1000 for i in range(20)], [5, 17, 300, 42]]
NEW_TOKENS = 8

ADAPTERS = {
    "tiny-llama-lora-a": ("tiny-llama", dict(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"])),
    "tiny-llama-lora-b": ("tiny-llama", dict(
        r=16, lora_alpha=32, use_rslora=True,
        target_modules=["q_proj", "k_proj", "o_proj", "gate_proj", "up_proj"])),
    "tiny-phi3-lora": ("tiny-phi3", dict(
        r=8, lora_alpha=8, target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])),
    # Gemma 2 norms the attention's and the MLP's outputs before the residual add: the o and
    # down deltas must join before those norms.
    "tiny-gemma2-lora": ("tiny-gemma2", dict(
        r=8, lora_alpha=16, target_modules=["q_proj", "o_proj", "gate_proj", "down_proj"])),
}


def base(name):
    path = os.path.join(DATA, name)
    # Gemma 2's soft-capped scores need the eager attention (as scripts/make_tiny_families.py).
    extra = {"attn_implementation": "eager"} if "gemma" in name else {}
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, **extra).eval()


def greedy(model, prompt):
    """`[{token, margin, top5: [[id, logprob], ...]}]` per generated step."""
    ids = list(prompt)
    steps = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            lp = torch.log_softmax(logits, dim=-1)
            v, i = torch.topk(lp, 5)
            steps.append({
                "token": int(i[0]),
                "margin": float(v[0] - v[1]),
                "top5": [[int(a), round(float(b), 7)] for a, b in zip(i, v)],
            })
            ids.append(int(i[0]))
    return steps


def make_adapter(out, base_name, cfg, seed):
    torch.manual_seed(seed)
    model = peft.get_peft_model(base(base_name), peft.LoraConfig(lora_dropout=0.0, **cfg))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                # Large enough that the adapter moves the logprobs well past the tolerance.
                p.copy_(torch.randn_like(p) * 0.25)
    path = os.path.join(DATA, out)
    model.save_pretrained(path)
    os.remove(os.path.join(path, "README.md"))
    # The folder's own path would end up in the file; name the base as the repository does.
    cfg_path = os.path.join(path, "adapter_config.json")
    with open(cfg_path) as f:
        saved = json.load(f)
    saved["base_model_name_or_path"] = f"tests/data/{base_name}"
    # PEFT keeps the modules as a set: its order changes from run to run.
    saved["target_modules"] = sorted(saved["target_modules"])
    with open(cfg_path, "w") as f:
        json.dump(saved, f, indent=2, sort_keys=True)
        f.write("\n")
    return model.eval()


def convert_gguf():
    """tiny-llama as llama.cpp converts it (its tokenizer hash is unknown to the converter,
    which is told the Llama 3 pre-tokenizer; the tests feed token ids)."""
    src = os.environ.get("LLAMA_CPP_SRC") or glob.glob(os.path.join(
        ROOT, "models-cache", "llama-cpp", "llama_cpp_python-*", "vendor", "llama.cpp"))[0]
    out = os.path.join(DATA, "tiny-llama-gguf")
    os.makedirs(out, exist_ok=True)
    code = ("import os, sys, runpy, transformers; sys.path.insert(0, sys.argv[1]); "
            "sys.argv = sys.argv[2:]; import conversion.base as b; "
            "b.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'llama-bpe'; "
            "transformers.AutoTokenizer.from_pretrained = lambda d, *a, **k: "
            "transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(str(d), "
            "'tokenizer.json')); runpy.run_path(sys.argv[0], run_name='__main__')")
    subprocess.run([sys.executable, "-c", code, src, os.path.join(src, "convert_hf_to_gguf.py"),
                    os.path.join(DATA, "tiny-llama"), "--outfile",
                    os.path.join(out, "tiny-llama.bf16.gguf"), "--outtype", "bf16"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main():
    torch.set_num_threads(1)
    cases = {}
    bases = {}
    for i, (out, (base_name, cfg)) in enumerate(ADAPTERS.items()):
        model = make_adapter(out, base_name, cfg, seed=100 + i)
        cases[out] = {"base": base_name, "runs": [greedy(model, p) for p in PROMPTS]}
        bases.setdefault(base_name, None)
    for base_name in bases:
        model = base(base_name)
        cases[base_name] = {"base": base_name, "runs": [greedy(model, p) for p in PROMPTS]}
    for out in ADAPTERS:
        moved = max(
            abs(a["top5"][0][1] - b["top5"][0][1])
            for ra, rb in zip(cases[out]["runs"], cases[ADAPTERS[out][0]]["runs"])
            for a, b in zip(ra, rb)
        )
        print(f"{out}: top-1 logprob moves by up to {moved:.3f} from the base")
    ref = {
        "made_by": made_by("scripts/make_tiny_lora.py", f"peft {peft.__version__}, CPU, float32"),
        "prompts": PROMPTS,
        "models": cases,
    }
    with open(os.path.join(DATA, "tiny-llama-lora-a", "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    convert_gguf()
    print("wrote", sorted(ADAPTERS), "and tiny-llama-gguf")


if __name__ == "__main__":
    main()
