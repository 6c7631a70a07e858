#!/usr/bin/env python3
"""Tiny random-weight ModernBERT sequence classifiers and their transformers references, for
`engine/tests/cross_encoder_parity.rs`:

    models-cache/torch-venv/bin/python scripts/make_tiny_modernbert.py

(any Python with torch, transformers and tokenizers; the versions used are recorded in each
reference.json). It writes, removing what was there:

    tests/data/tiny-modernbert-reranker/    ModernBertForSequenceClassification, num_labels 1,
                                            `cls` pooling (the mxbai-rerank / gte-reranker
                                            layout): alternating full and sliding-window
                                            layers, RoPE with a base per layer type, GeGLU,
                                            no biases but the classifier's
    tests/data/tiny-modernbert-classifier/  the same body with `mean` pooling, a GELU-tanh
                                            head, norm and MLP biases, and 3 labels

The tokenizer is `make_tiny_cross_encoders.py`'s WordPiece vocabulary with ModernBERT's
template (`[CLS] $A [SEP] $B [SEP]`, one token type). The sliding window (`local_attention`
8: each token sees 4 on either side) is shorter than every reference pair, so the local
layers' masks change the answer. Weights come from fixed seeds on one thread; two runs give
identical files. References: transformers' float32 eager forward (logits, and the sigmoid
score vLLM's score task gives a single-label head).
"""

import os
import sys

import torch
import transformers
from tokenizers import processors

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_cross_encoders as ce  # noqa: E402


def tokenizer():
    fast, vocab = ce.wordpiece_tokenizer()
    tok = fast.backend_tokenizer
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=128,
        model_input_names=["input_ids", "attention_mask"],
    )
    return fast, vocab, cls, sep


def config(vocab, cls, sep, **kw):
    return transformers.ModernBertConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=4, max_position_embeddings=128, local_attention=8,
        global_attn_every_n_layers=2, global_rope_theta=160000.0, local_rope_theta=10000.0,
        pad_token_id=0, cls_token_id=cls, sep_token_id=sep, bos_token_id=cls, eos_token_id=sep,
        initializer_range=0.2, attn_implementation="eager", **kw,
    )


def versions():
    import tokenizers

    return (f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}, "
            f"torch {torch.__version__.split('+')[0]}, CPU, float32, eager attention")


def randomise(model, seed):
    """Non-zero values everywhere, LayerNorm scales and biases included, so a norm read as
    the identity or a bias left out changes the answer."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


def reference(out, about, fields):
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager").eval()

    def logits_of(enc):
        with torch.no_grad():
            return model(**enc).logits[0]

    ref = {"made_by": f"scripts/make_tiny_modernbert.py ({versions()})", "about": about}
    if "pairs" in fields:
        def case(q, d, max_length=None):
            query, doc = ce.QUERIES[q], ce.DOCUMENTS[d]
            kw = {"truncation": True, "max_length": max_length} if max_length else {}
            enc = tokenizer(query, doc, return_tensors="pt", **kw)
            logit = float(logits_of(enc)[0])
            row = {
                "query": query,
                "document": doc,
                "input_ids": enc["input_ids"][0].tolist(),
                "token_type_ids": None,
                "logit": ce.f32(logit),
                "score": ce.f32(float(torch.sigmoid(torch.tensor(logit, dtype=torch.float64)))),
            }
            if max_length is not None:
                row["max_length"] = max_length
            return row
        ref["pairs"] = [case(q, d) for q, d in ce.PAIRS]
        ref["truncated"] = [case(q, d, m) for q, d, m in ce.TRUNCATED]
        assert min(len(p["input_ids"]) for p in ref["pairs"]) > 9, "pairs longer than the window"
        print(os.path.basename(out), [round(p["logit"], 3) for p in ref["pairs"]])
    else:
        rows = []
        for text in ce.CLASSIFY_TEXTS:
            enc = tokenizer(text, return_tensors="pt")
            logits = logits_of(enc)
            probs = torch.softmax(logits.double(), dim=-1)
            rows.append({
                "text": text,
                "input_ids": enc["input_ids"][0].tolist(),
                "logits": [ce.f32(x) for x in logits.tolist()],
                "probs": [ce.f32(x) for x in probs.tolist()],
                "label": model.config.id2label[int(torch.argmax(logits))],
            })
        ref["texts"] = rows
        print(os.path.basename(out), [r["label"] for r in rows])
    ce.write_json(os.path.join(out, "reference.json"), ref)


def main():
    torch.set_num_threads(1)
    tok, vocab, cls, sep = tokenizer()

    torch.manual_seed(40)
    cfg = config(vocab, cls, sep, num_labels=1, classifier_pooling="cls")
    model = transformers.ModernBertForSequenceClassification(cfg).eval()
    randomise(model, 41)
    out = os.path.join(ce.DATA, "tiny-modernbert-reranker")
    ce.save(model, tok, out)
    reference(out, "transformers' logit of each (query, document) pair, and its sigmoid", {"pairs"})

    torch.manual_seed(42)
    cfg = config(
        vocab, cls, sep, num_labels=3, classifier_pooling="mean", norm_bias=True, mlp_bias=True,
        attention_bias=True, classifier_bias=True, classifier_activation="gelu_pytorch_tanh",
        problem_type="single_label_classification",
        id2label={0: "negative", 1: "neutral", 2: "positive"},
        label2id={"negative": 0, "neutral": 1, "positive": 2},
    )
    model = transformers.ModernBertForSequenceClassification(cfg).eval()
    randomise(model, 43)
    out = os.path.join(ce.DATA, "tiny-modernbert-classifier")
    ce.save(model, tok, out)
    reference(out, "transformers' logits and softmax (single_label_classification) of each text",
              {"texts"})


if __name__ == "__main__":
    main()
