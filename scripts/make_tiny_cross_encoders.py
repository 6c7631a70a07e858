#!/usr/bin/env python3
"""Tiny random-weight sequence-classification checkpoints (cross-encoders and a classifier)
and their reference outputs, for `engine/tests/cross_encoder_parity.rs` and the gateway's
router tests:

    pip install --target /tmp/st sentence-transformers   # plus its pure-Python dependencies
    PYTHONPATH=/tmp/st python scripts/make_tiny_cross_encoders.py

(any Python with torch, transformers, tokenizers and sentence-transformers; the versions used
are recorded in each reference.json). It writes, removing what was there:

    tests/data/tiny-cross-encoder/   BertForSequenceClassification, num_labels 1 (the
                                     ms-marco-MiniLM cross-encoder layout), WordPiece tokenizer
                                     with token type ids, sentence-transformers' Sigmoid
                                     activation recorded in config.json
    tests/data/tiny-reranker/        XLMRobertaForSequenceClassification, num_labels 1 (the
                                     bge-reranker layout: no pooler, dense + tanh + out_proj on
                                     <s>, positions from padding_idx + 1, one token type),
                                     Unigram (SentencePiece-style) tokenizer, <s> a </s></s> b </s>
    tests/data/tiny-classifier/      BertForSequenceClassification, num_labels 3 with id2label,
                                     problem_type single_label_classification

Each folder gets config.json, model.safetensors (f32), tokenizer.json, tokenizer_config.json
and reference.json. The cross-encoders' references are sentence-transformers' CrossEncoder
`predict` (its activation, and with an Identity activation the raw logits), checked against
transformers' own forward; the classifier's is transformers' logits and softmax. The
tokenizers' vocabularies are built here from the corpus below (no trainer, so no ties broken
by hash order); weights come from fixed seeds on one thread. Two runs give identical files.
"""

import json
import math
import os
import shutil
from collections import Counter

import numpy
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(ROOT, "tests", "data")

CORPUS = """
The capital of France is Paris, a city on the river Seine. Berlin is the capital of Germany.
Rome is the capital of Italy and was the centre of an empire. Madrid is in the middle of Spain.
A cat is a small animal that likes to sleep in the sun. Dogs are loyal animals and like to run.
The weather today is cold and wet, with rain in the morning and wind in the evening.
Python is a programming language. Rust is a programming language that is fast and safe.
Water boils at one hundred degrees at sea level. Ice melts when the weather is warm.
How many people live in Paris? What is the capital of Germany? Where do cats like to sleep?
The train to the city leaves in the morning. The museum in Rome is open in the evening.
A good book and a cup of tea make a quiet evening. The river is wide and the water is cold.
"""

QUERIES = [
    "what is the capital of france",
    "where do cats sleep",
    "is rust a fast programming language",
]
DOCUMENTS = [
    "Paris is the capital of France.",
    "A cat likes to sleep in the sun.",
    "Rust is a programming language that is fast and safe.",
    "The weather today is cold and wet.",
    "Berlin is the capital of Germany, a city with many museums.",
    "Zebras graze quietly.",
]
# (query index, document index) pairs scored in the references: every document against the
# first query (a rerank), and a few N:N pairs.
PAIRS = [(0, d) for d in range(len(DOCUMENTS))] + [(1, 1), (2, 2), (1, 3), (2, 5)]
# Pairs scored after longest-first truncation to `max_length` tokens (special tokens counted).
TRUNCATED = [(0, 4, 12), (2, 2, 9), (1, 5, 16)]

CLASSIFY_TEXTS = [
    "The weather today is cold and wet.",
    "A good book and a cup of tea make a quiet evening.",
    "Dogs are loyal animals and like to run.",
    "zebras!",
]


def words(text):
    out, cur = [], ""
    for ch in text.lower():
        if ch.isalnum():
            cur += ch
        else:
            if cur:
                out.append(cur)
                cur = ""
            if not ch.isspace():
                out.append(ch)
    if cur:
        out.append(cur)
    return out


def corpus_counts():
    counts = Counter()
    for text in [CORPUS] + QUERIES + DOCUMENTS + CLASSIFY_TEXTS:
        counts.update(words(text))
    return counts


def wordpiece_tokenizer():
    """BERT's layout (MiniLM's tokenizer.json): BertNormalizer (lowercase), BertPreTokenizer,
    WordPiece, `[CLS] $A [SEP]` and `[CLS] $A [SEP] $B:1 [SEP]:1`. The vocabulary: the special
    tokens, every character of the corpus alone and as `##c`, and every word seen at least
    twice, so rarer words split into pieces."""
    counts = corpus_counts()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = sorted({c for w in counts for c in w})
    vocab = list(specials) + chars + ["##" + c for c in chars if c.isalnum()]
    frequent = sorted((w for w, n in counts.items() if n >= 2 and len(w) > 1), key=lambda w: (-counts[w], w))
    vocab += frequent
    ids = {t: i for i, t in enumerate(vocab)}
    tok = Tokenizer(models.WordPiece(ids, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, clean_text=True, handle_chinese_chars=True, strip_accents=None)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    for s in specials:
        tok.add_special_tokens([s])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=128,
        # BERT's tokenizer hands the model each token's segment; the generic class does not
        # unless told to.
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
    return fast, len(vocab)


def unigram_tokenizer():
    """XLM-R's layout: NFKC, Metaspace (`▁`, prepended), Unigram, `<s> $A </s>` and
    `<s> $A </s> </s> $B </s>` with one token type. Ids 0-3 are `<s> <pad> </s> <unk>` as in
    XLM-R, `<mask>` is last. Pieces: every character (alone and after `▁`) and every word seen
    at least twice after `▁`, scored by log frequency, so the Viterbi split prefers whole
    words and falls back to characters."""
    counts = corpus_counts()
    total = sum(counts.values())
    pieces = {}
    for w, n in counts.items():
        for c in w:
            pieces[c] = pieces.get(c, 0) + n
        pieces["\u2581" + w[0]] = pieces.get("\u2581" + w[0], 0) + n
        if n >= 2 and len(w) > 1:
            pieces["\u2581" + w] = pieces.get("\u2581" + w, 0) + n
    pieces["\u2581"] = total
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    for p in sorted(pieces, key=lambda p: (-pieces[p], p)):
        # Characters cost more than whole words, so whole words win where they exist.
        penalty = 0.0 if len(p.lstrip("\u2581")) > 1 else 4.0
        vocab.append((p, round(math.log(pieces[p] / (2 * total)) - penalty, 4)))
    vocab.append(("<mask>", 0.0))
    tok = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    for s in ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]:
        tok.add_special_tokens([s])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        sep_token="</s>", cls_token="<s>", pad_token="<pad>", mask_token="<mask>",
        model_max_length=128,
    )
    return fast, len(vocab)


def save(model, tokenizer, out, extra_config=None):
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    cfg_path = os.path.join(out, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg.update(extra_config or {})
    # Fields transformers writes that hold nothing for these folders.
    cfg.pop("transformers_version", None)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    for name in os.listdir(out):
        if name not in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            os.remove(os.path.join(out, name))


def versions():
    import sentence_transformers
    import tokenizers

    return (f"transformers {transformers.__version__}, sentence-transformers "
            f"{sentence_transformers.__version__}, tokenizers {tokenizers.__version__}, "
            f"torch {torch.__version__.split('+')[0]}, CPU, float32")


def f32(x):
    """The shortest decimal that reads back as the same f32."""
    return float(str(numpy.float32(x)))


def cross_encoder_reference(out, name, about):
    from sentence_transformers import CrossEncoder

    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out, dtype=torch.float32).eval()
    ce = CrossEncoder(out, device="cpu")
    identity = torch.nn.Identity()

    def case(q, d, max_length=None):
        query, doc = QUERIES[q], DOCUMENTS[d]
        kw = {"truncation": True, "max_length": max_length} if max_length else {}
        enc = tokenizer(query, doc, return_tensors="pt", **kw)
        with torch.no_grad():
            logit = float(model(**enc).logits[0, 0])
        row = {
            "query": query,
            "document": doc,
            "input_ids": enc["input_ids"][0].tolist(),
            "token_type_ids": enc["token_type_ids"][0].tolist() if "token_type_ids" in enc else None,
            "logit": f32(logit),
            "score": f32(1.0 / (1.0 + math.exp(-logit))),
        }
        if max_length is None:
            # sentence-transformers' own numbers: its activation, and the raw logit.
            st_score = float(ce.predict([(query, doc)], convert_to_numpy=True)[0])
            st_logit = float(ce.predict([(query, doc)], activation_fn=identity, convert_to_numpy=True)[0])
            assert abs(st_score - row["score"]) < 1e-6, (st_score, row["score"])
            assert abs(st_logit - row["logit"]) < 1e-5, (st_logit, row["logit"])
            row["score"], row["logit"] = f32(st_score), f32(st_logit)
        else:
            row["max_length"] = max_length
            assert len(row["input_ids"]) <= max_length
        return row

    ref = {
        "made_by": f"scripts/make_tiny_cross_encoders.py ({versions()})",
        "about": about,
        "pairs": [case(q, d) for q, d in PAIRS],
        "truncated": [case(q, d, m) for q, d, m in TRUNCATED],
    }
    scores = [p["logit"] for p in ref["pairs"]]
    print(name, "logits", [round(s, 3) for s in scores])
    write_json(os.path.join(out, "reference.json"), ref)


def classifier_reference(out):
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out, dtype=torch.float32).eval()
    rows = []
    for text in CLASSIFY_TEXTS:
        enc = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits[0]
        probs = torch.softmax(logits.double(), dim=-1)
        rows.append({
            "text": text,
            "input_ids": enc["input_ids"][0].tolist(),
            "logits": [f32(x) for x in logits.tolist()],
            "probs": [f32(x) for x in probs.tolist()],
            "label": model.config.id2label[int(torch.argmax(logits))],
        })
        print("classifier", rows[-1]["label"], [round(p, 3) for p in rows[-1]["probs"]])
    ref = {
        "made_by": f"scripts/make_tiny_cross_encoders.py ({versions()})",
        "about": "transformers' logits and softmax (single_label_classification) of each text",
        "texts": rows,
    }
    write_json(os.path.join(out, "reference.json"), ref)


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=1)
        f.write("\n")


def bert_config(vocab, **kw):
    return transformers.BertConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=128, type_vocab_size=2,
        hidden_act="gelu", layer_norm_eps=1e-12, initializer_range=0.2, pad_token_id=0, **kw,
    )


def main():
    torch.set_num_threads(1)
    wp, wp_vocab = wordpiece_tokenizer()

    torch.manual_seed(30)
    cfg = bert_config(wp_vocab, num_labels=1)
    out = os.path.join(DATA, "tiny-cross-encoder")
    save(transformers.BertForSequenceClassification(cfg).eval(), wp, out,
         {"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}})
    cross_encoder_reference(out, "tiny-cross-encoder",
                            "CrossEncoder.predict of each (query, document) pair: score with its Sigmoid, logit with Identity")

    sp, sp_vocab = unigram_tokenizer()
    torch.manual_seed(31)
    cfg = transformers.XLMRobertaConfig(
        vocab_size=sp_vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=130, type_vocab_size=1,
        hidden_act="gelu", layer_norm_eps=1e-5, initializer_range=0.2, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, num_labels=1,
    )
    out = os.path.join(DATA, "tiny-reranker")
    save(transformers.XLMRobertaForSequenceClassification(cfg).eval(), sp, out)
    cross_encoder_reference(out, "tiny-reranker",
                            "CrossEncoder.predict of each (query, document) pair: score with its default activation (Sigmoid), logit with Identity")

    torch.manual_seed(32)
    cfg = bert_config(
        wp_vocab, num_labels=3, problem_type="single_label_classification",
        id2label={0: "negative", 1: "neutral", 2: "positive"},
        label2id={"negative": 0, "neutral": 1, "positive": 2},
    )
    out = os.path.join(DATA, "tiny-classifier")
    save(transformers.BertForSequenceClassification(cfg).eval(), wp, out)
    classifier_reference(out)


if __name__ == "__main__":
    main()
