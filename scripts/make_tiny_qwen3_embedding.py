#!/usr/bin/env python3
"""A tiny random-weight decoder embedding model in the Qwen3-Embedding layout, and
sentence-transformers' vectors for it, for `engine/tests/decoder_embedding_parity.rs` and the
black-box embedding tests:

    pip install --target /tmp/st sentence-transformers   # plus its pure-Python dependencies
    PYTHONPATH=/tmp/st python scripts/make_tiny_qwen3_embedding.py

(any Python with torch, transformers, tokenizers and sentence-transformers; the versions used
are recorded in reference.json). It writes, removing what was there,
`tests/data/tiny-qwen3-embedding/`:

    config.json             Qwen3 (2 layers, hidden 64, 4 query and 2 KV heads of 16, Q/K
                            norms, tied embeddings), `architectures: ["Qwen3ForCausalLM"]` as
                            Qwen3-Embedding's own config says
    model.safetensors       bf16, saved from `Qwen3Model`: tensor names without the `model.`
                            prefix, as in Qwen3-Embedding's file
    tokenizer.json          tiny-qwen2-vl's byte-level BPE with Qwen3-Embedding's post-processor
                            (`<|endoftext|>` appended to every input)
    tokenizer_config.json   `padding_side: left`, as Qwen3-Embedding
    modules.json, 1_Pooling/config.json (`pooling_mode_lasttoken`), sentence_bert_config.json
                            the sentence-transformers files (Transformer, Pooling, Normalize)
    reference.json          sentence-transformers' `encode` of each text: alone, and all
                            together in one padded batch; also with mean pooling (the same
                            folder with `pooling_mode_mean_tokens`), and without the Normalize

The reference is `SentenceTransformer` loading the written folder (float32 on the stored
bf16 weights), checked against transformers' own forward for the last-token vectors. Weights
come from a fixed seed on one thread; two runs give identical files.
"""

import json
import os
import shutil

import numpy
import torch
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(ROOT, "tests", "data")
OUT = os.path.join(DATA, "tiny-qwen3-embedding")
TOKENIZER = os.path.join(DATA, "tiny-qwen2-vl", "tokenizer.json")
EOT = "<|endoftext|>"

# Lengths from a few tokens to several dozen, so the padded batch pads most of them.
TEXTS = [
    "Paris",
    "The capital of France is Paris.",
    "What is the capital of Germany?",
    "A cat is a small animal that likes to sleep in the sun, and a dog is a loyal animal that "
    "likes to run in the park with the children in the morning.",
    "Rust is fast.",
    "The weather today is cold and wet, with rain in the morning.",
]

MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def pooling_config(mode):
    return {
        "word_embedding_dimension": 64,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": mode == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": mode == "lasttoken",
        "include_prompt": True,
    }


def write_json(path, value, indent=2):
    with open(path, "w") as f:
        json.dump(value, f, indent=indent, sort_keys=indent == 2)
        f.write("\n")


def versions():
    import sentence_transformers
    import tokenizers

    return (f"transformers {transformers.__version__}, sentence-transformers "
            f"{sentence_transformers.__version__}, tokenizers {tokenizers.__version__}, "
            f"torch {torch.__version__.split('+')[0]}, CPU, float32 on the bf16 weights")


def f32(x):
    """The shortest decimal that reads back as the same f32."""
    return float(str(numpy.float32(x)))


def write_tokenizer(out):
    with open(TOKENIZER) as f:
        tok = json.load(f)
    eot = next(t["id"] for t in tok["added_tokens"] if t["content"] == EOT)
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": EOT, "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": EOT, "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}},
                 {"SpecialToken": {"id": EOT, "type_id": 1}}],
        "special_tokens": {EOT: {"id": EOT, "ids": [eot], "tokens": [EOT]}},
    }
    write_json(os.path.join(out, "tokenizer.json"), tok, indent=None)
    write_json(os.path.join(out, "tokenizer_config.json"), {
        "backend": "tokenizers",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": EOT,
        "padding_side": "left",
        "model_max_length": 256,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    })
    return eot


def write_model(out, eot):
    config = transformers.Qwen3Config(
        vocab_size=768, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.2,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=eot, eos_token_id=eot, pad_token_id=eot,
    )
    torch.manual_seed(30)
    model = transformers.Qwen3Model(config)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.dim() == 1:
                p.normal_(1.0, 0.1)
    model = model.to(torch.bfloat16).eval()
    model.save_pretrained(out)
    cfg_path = os.path.join(out, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["architectures"] = ["Qwen3ForCausalLM"]
    cfg.pop("transformers_version", None)
    write_json(cfg_path, cfg)
    gen = os.path.join(out, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)


def write_sentence_transformers(out, mode="lasttoken"):
    write_json(os.path.join(out, "modules.json"), MODULES)
    os.makedirs(os.path.join(out, "1_Pooling"), exist_ok=True)
    write_json(os.path.join(out, "1_Pooling", "config.json"), pooling_config(mode))
    write_json(os.path.join(out, "sentence_bert_config.json"),
               {"max_seq_length": 256, "do_lower_case": False})


def encode(folder, normalize=True):
    """sentence-transformers' vectors of TEXTS: each alone, and all in one padded batch."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(folder, device="cpu", model_kwargs={"dtype": torch.float32})
    alone = [st.encode([t], batch_size=1, convert_to_numpy=True)[0] for t in TEXTS]
    batch = st.encode(TEXTS, batch_size=len(TEXTS), convert_to_numpy=True)
    ids = [st.tokenize([t])["input_ids"][0].tolist() for t in TEXTS]
    has_normalize = any(type(m).__name__ == "Normalize" for m in st)
    assert has_normalize == normalize, (has_normalize, normalize)
    return st, ids, alone, batch


def transformers_last_token(folder, ids):
    """The final-norm hidden state of each input's last token, straight from transformers."""
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for row in ids:
            h = model(input_ids=torch.tensor([row])).last_hidden_state[0, -1]
            out.append(h.numpy())
    return out


def cosine(a, b):
    a, b = numpy.asarray(a, dtype=numpy.float64), numpy.asarray(b, dtype=numpy.float64)
    return float(a @ b / (numpy.linalg.norm(a) * numpy.linalg.norm(b)))


def rows(vectors):
    return [[f32(x) for x in v] for v in vectors]


def main():
    torch.set_num_threads(1)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    eot = write_tokenizer(OUT)
    write_model(OUT, eot)
    write_sentence_transformers(OUT)

    from tokenizers import Tokenizer
    raw = Tokenizer.from_file(os.path.join(OUT, "tokenizer.json"))
    st, ids, alone, batch = encode(OUT)
    for text, row in zip(TEXTS, ids):
        assert row == raw.encode(text).ids and row[-1] == eot, (text, row)
    # The last-token vectors are transformers' final-norm states of the last token.
    for v, h in zip(alone, transformers_last_token(OUT, ids)):
        unit = h / numpy.linalg.norm(h)
        assert numpy.abs(v - unit).max() < 1e-5, numpy.abs(v - unit).max()
    for v, b in zip(alone, batch):
        assert cosine(v, b) > 0.99999, cosine(v, b)

    # The same folder with mean pooling, and without the Normalize module.
    with_mean = os.path.join("/tmp", "tiny-qwen3-embedding-mean")
    shutil.rmtree(with_mean, ignore_errors=True)
    shutil.copytree(OUT, with_mean)
    write_json(os.path.join(with_mean, "1_Pooling", "config.json"), pooling_config("mean"))
    _, _, mean_alone, mean_batch = encode(with_mean)
    shutil.rmtree(with_mean)
    unnormalised = os.path.join("/tmp", "tiny-qwen3-embedding-plain")
    shutil.rmtree(unnormalised, ignore_errors=True)
    shutil.copytree(OUT, unnormalised)
    write_json(os.path.join(unnormalised, "modules.json"), MODULES[:2])
    _, _, _, plain_batch = encode(unnormalised, normalize=False)
    shutil.rmtree(unnormalised)

    ref = {
        "made_by": f"scripts/make_tiny_qwen3_embedding.py ({versions()})",
        "about": "sentence-transformers' encode of each text (unit vectors: the folder has a "
                 "Normalize module): `*_alone` one text per call, `*_batch` all texts in one "
                 "left-padded batch; `lasttoken_*` the folder as written, `mean_*` the same "
                 "folder with pooling_mode_mean_tokens; `unnormalised_batch` the folder without "
                 "its Normalize module",
        "texts": TEXTS,
        "input_ids": ids,
        "lasttoken_alone": rows(alone),
        "lasttoken_batch": rows(batch),
        "mean_alone": rows(mean_alone),
        "mean_batch": rows(mean_batch),
        "unnormalised_batch": rows(plain_batch),
    }
    write_json(os.path.join(OUT, "reference.json"), ref, indent=1)
    print("wrote", OUT, sorted(os.listdir(OUT)))
    print("token counts", [len(r) for r in ids])
    print("norms before Normalize", [round(float(numpy.linalg.norm(v)), 3) for v in plain_batch])


if __name__ == "__main__":
    main()
