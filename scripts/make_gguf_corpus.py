#!/usr/bin/env python3
"""Seed corpus of the `gguf_load` fuzz target (fuzz/fuzz_targets/gguf_load.rs), which
`engine/tests/gguf_corpus.rs` also runs through the same entry point in every `cargo test`:

    python3 scripts/make_gguf_corpus.py    # writes fuzz/seeds/gguf_load/

No dependencies: the files are written field by field, so a case can break exactly one
thing. `valid.gguf` is a complete one-layer Llama of hidden size 32 (a byte-level BPE
vocabulary of 16 tokens, matrices in Q8_0, Q4_0, Q4_1, Q5_0, IQ4_NL and F16) that loads; every
other file is it with one field made wrong: truncations, counts and lengths past the end,
offsets past the end or misaligned, sizes that do not match the type, unknown and
kernel-less tensor types, absurd hyper-parameters, a broken vocabulary. Deterministic: the
same bytes on every run.
"""

import os
import random
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "seeds", "gguf_load")

# Metadata value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "B",
          U64: "Q", I64: "q", F64: "d"}
# Tensor types: id -> (elements per block, bytes per block).
T_F32, T_F16, T_Q4_0, T_Q4_1, T_Q5_0, T_Q8_0, T_Q8_1, T_IQ4_NL = 0, 1, 2, 3, 6, 8, 9, 20
LAYOUT = {T_F32: (1, 4), T_F16: (1, 2), T_Q4_0: (32, 18), T_Q4_1: (32, 20), T_Q5_0: (32, 22),
          T_Q8_0: (32, 34), T_Q8_1: (32, 36), T_IQ4_NL: (32, 18), 99: (32, 18)}
HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 32, 32, 2, 1, 16
HEAD_DIM = HIDDEN // HEADS


def text(s):
    b = s if isinstance(s, bytes) else s.encode()
    return struct.pack("<Q", len(b)) + b


def value(ty, v):
    if ty == STR:
        return text(v)
    if ty == ARR:
        item_ty, items = v
        return struct.pack("<IQ", item_ty, len(items)) + b"".join(value(item_ty, i) for i in items)
    return struct.pack("<" + SCALAR[ty], v)


def tensor_bytes(rng, ty, n):
    """`n` elements of type `ty`: small finite scales, random quants."""
    block, size = LAYOUT[ty]
    if ty == T_F32:
        return struct.pack(f"<{n}f", *[1.0 + rng.uniform(-0.1, 0.1) for _ in range(n)])
    if ty == T_F16:
        return struct.pack(f"<{n}e", *[rng.uniform(-0.1, 0.1) for _ in range(n)])
    out = b""
    for _ in range(n // block):
        scales = struct.pack("<e", 0.01) * (2 if ty in (T_Q4_1, T_Q8_1) else 1)
        out += scales + bytes(rng.randrange(256) for _ in range(size - len(scales)))
    return out


def tokens():
    toks = ["<|endoftext|>", "a", "b", "c", "d", "e", "\u0120", "1", "2", "H", "l", "o", "ab",
            "\u0120a", "!", "?"]
    assert len(toks) == VOCAB
    return toks


class As:
    """A metadata override of another value type."""

    def __init__(self, ty, v):
        self.ty, self.v = ty, v


def metadata(**over):
    """The valid file's metadata as (key, type, value). `over` (dots in keys as `__`) replaces
    a value (same type), or adds or retypes one with `As`; None drops it."""
    meta = [
        ("general.architecture", STR, "llama"),
        ("general.name", STR, "corpus"),
        ("llama.embedding_length", U32, HIDDEN),
        ("llama.block_count", U32, 1),
        ("llama.attention.head_count", U32, HEADS),
        ("llama.attention.head_count_kv", U32, KV_HEADS),
        ("llama.feed_forward_length", U32, FFN),
        ("llama.context_length", U32, 64),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("llama.rope.freq_base", F32, 10000.0),
        ("tokenizer.ggml.model", STR, "gpt2"),
        ("tokenizer.ggml.pre", STR, "smollm"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens())),
        ("tokenizer.ggml.token_type", ARR, (I32, [3] + [1] * (VOCAB - 1))),
        ("tokenizer.ggml.merges", ARR, (STR, ["a b", "\u0120 a"])),
        ("tokenizer.ggml.bos_token_id", U32, 0),
        ("tokenizer.ggml.eos_token_id", U32, 0),
        ("tokenizer.chat_template", STR, "{% for m in messages %}{{ m.content }}{% endfor %}"),
    ]
    over = {k.replace("__", "."): v for k, v in over.items()}
    out = []
    for key, ty, v in meta:
        if key in over:
            v = over.pop(key)
            if v is None:
                continue
            if isinstance(v, As):
                ty, v = v.ty, v.v
        out.append((key, ty, v))
    out += [(k, v.ty, v.v) for k, v in over.items()]
    return out


def tensors(**types):
    """The valid file's tensors as (name, dims, type); `types` replaces a type by name (dots
    as `__`)."""
    t = [
        ("token_embd.weight", [HIDDEN, VOCAB], T_Q8_0),
        ("output_norm.weight", [HIDDEN], T_F32),
        ("blk.0.attn_norm.weight", [HIDDEN], T_F32),
        ("blk.0.attn_q.weight", [HIDDEN, HEADS * HEAD_DIM], T_Q8_0),
        ("blk.0.attn_k.weight", [HIDDEN, KV_HEADS * HEAD_DIM], T_F16),
        ("blk.0.attn_v.weight", [HIDDEN, KV_HEADS * HEAD_DIM], T_Q5_0),
        ("blk.0.attn_output.weight", [HEADS * HEAD_DIM, HIDDEN], T_Q4_0),
        ("blk.0.ffn_norm.weight", [HIDDEN], T_F32),
        ("blk.0.ffn_gate.weight", [HIDDEN, FFN], T_Q4_1),
        ("blk.0.ffn_up.weight", [HIDDEN, FFN], T_Q8_0),
        ("blk.0.ffn_down.weight", [FFN, HIDDEN], T_IQ4_NL),
    ]
    return [(n, d, types.get(n.replace(".", "__"), ty)) for n, d, ty in t]


def build(meta=None, infos=None, version=3, n_tensors=None, n_kv=None, alignment=32,
          offset_of=None):
    """A GGUF file. `infos` are (name, dims, type) with data sized by the type, or
    (name, dims, type, payload); `offset_of` maps a tensor name to the offset to write for it."""
    meta = metadata() if meta is None else meta
    infos = tensors() if infos is None else infos
    rng = random.Random(7)
    head = b"GGUF" + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                 len(meta) if n_kv is None else n_kv)
    kv = b"".join(text(k) + struct.pack("<I", ty) + value(ty, v) for k, ty, v in meta)
    info_bytes, data = b"", b""
    for info in infos:
        name, dims, ty = info[:3]
        n = 1
        for d in dims:
            n *= d
        payload = info[3] if len(info) > 3 else tensor_bytes(rng, ty, n)
        data += b"\0" * (-len(data) % alignment)
        offset = (offset_of or {}).get(name, len(data))
        info_bytes += (text(name) + struct.pack("<I", len(dims))
                       + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ty, offset))
        data += payload
    out = head + kv + info_bytes
    return out + b"\0" * (-len(out) % alignment) + data


def replace_once(buf, old, new):
    assert buf.count(old) == 1, old
    return buf.replace(old, new)


def with_tensor(name, dims=None, ty=None, payload=None):
    """The valid file's tensors with one changed."""
    out = []
    for n, d, t in tensors():
        if n == name:
            info = (n, d if dims is None else dims, t if ty is None else ty)
            out.append(info if payload is None else info + (payload,))
        else:
            out.append((n, d, t))
    return out


def cases():
    valid = build()
    kv_start = 24
    info_start = len(build(infos=[]))  # header and metadata, padded
    tokens_head = text("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARR, STR, VOCAB)
    tokens_claiming = lambda n: text("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARR, STR, n)
    nested = As(ARR, (U8, [1]))
    for _ in range(6):
        nested = As(ARR, (ARR, [nested.v]))
    return {
        "valid.gguf": valid,
        "empty.gguf": b"",
        "bad-magic.gguf": b"GGUX" + valid[4:],
        "version-1.gguf": valid[:4] + struct.pack("<I", 1) + valid[8:],
        "truncated-header.gguf": valid[:14],
        "truncated-metadata.gguf": valid[: kv_start + (info_start - kv_start) // 2],
        "truncated-tensor-infos.gguf": valid[: info_start + 40],
        "truncated-data.gguf": valid[:-100],
        "tensor-count-absurd.gguf": build(n_tensors=1 << 62),
        "metadata-count-absurd.gguf": build(n_kv=1 << 40),
        # Counts a byte-per-entry check lets through: an entry takes at least 13 bytes, a
        # tensor's at least 32.
        "metadata-count-past-end.gguf": build(n_kv=(len(valid) - kv_start) // 8 - 1),
        "tensor-count-past-end.gguf": build(n_tensors=(len(valid) - kv_start) // 8 - 1),
        "string-length-absurd.gguf": replace_once(
            valid, text("general.architecture"),
            struct.pack("<Q", (1 << 64) - 1) + b"general.architecture"),
        "array-length-absurd.gguf": replace_once(valid, tokens_head, tokens_claiming(1 << 62)),
        # Claims every item fits in what is left, but strings take 8 bytes or more each.
        "array-length-past-end.gguf": replace_once(
            valid, tokens_head,
            tokens_claiming(len(valid) - valid.index(tokens_head) - len(tokens_head))),
        "array-nested-deep.gguf": build(meta=metadata(deep=nested)),
        "value-type-unknown.gguf": replace_once(
            valid, text("general.name") + struct.pack("<I", STR),
            text("general.name") + struct.pack("<I", 13)),
        "bool-invalid.gguf": build(meta=metadata(tokenizer__ggml__add_bos_token=As(U8, 2)))
        .replace(text("tokenizer.ggml.add_bos_token") + struct.pack("<I", U8),
                 text("tokenizer.ggml.add_bos_token") + struct.pack("<I", BOOL)),
        "key-not-utf8.gguf": replace_once(valid, text("general.name"), text(b"general.\xffame")),
        "value-not-utf8.gguf": build(meta=metadata(general__name=b"corpus \xc3\x28")),
        "alignment-zero.gguf": build(meta=metadata(general__alignment=As(U32, 0))),
        "alignment-not-power-of-two.gguf": build(meta=metadata(general__alignment=As(U32, 24))),
        "alignment-absurd.gguf": build(meta=metadata(general__alignment=As(U64, 1 << 63))),
        "offset-past-end.gguf": build(offset_of={"blk.0.ffn_down.weight": 1 << 40}),
        "offset-overflow.gguf": build(offset_of={"blk.0.ffn_down.weight": (1 << 64) - 32}),
        "offset-misaligned.gguf": build(offset_of={"blk.0.attn_q.weight": 33}),
        "dims-overflow.gguf": build(infos=tensors() + [("huge", [1 << 32] * 3, T_F32, b"")]),
        "dims-count-zero.gguf": build(infos=tensors() + [("none", [], T_F32, b"")]),
        "dims-count-five.gguf": build(infos=tensors() + [("five", [1] * 5, T_F32)]),
        "dims-zero.gguf": build(infos=with_tensor("blk.0.attn_q.weight", [HIDDEN, 0], payload=b"")),
        "row-not-block-multiple.gguf": build(
            infos=tensors() + [("odd_row", [33, 2], T_Q8_0, b"\0" * 68)]),
        "size-mismatch.gguf": build(
            infos=with_tensor("blk.0.attn_q.weight", [HIDDEN, 2 * HEADS * HEAD_DIM])),
        "type-unknown.gguf": build(infos=with_tensor("blk.0.attn_q.weight", ty=99)),
        "type-without-kernel.gguf": build(infos=with_tensor("blk.0.attn_q.weight", ty=T_Q8_1)),
        "norm-quantised.gguf": build(infos=with_tensor("blk.0.attn_norm.weight", ty=T_Q8_0)),
        "duplicate-tensor.gguf": build(infos=tensors() + [tensors()[1]]),
        "missing-tensor.gguf": build(infos=tensors()[:-1]),
        "embedding-one-dim.gguf": build(infos=with_tensor("token_embd.weight", [HIDDEN * VOCAB])),
        "architecture-unknown.gguf": build(meta=metadata(general__architecture="gptj")),
        "architecture-not-string.gguf": build(meta=metadata(general__architecture=As(U32, 7))),
        "hidden-missing.gguf": build(meta=metadata(llama__embedding_length=None)),
        "block-count-absurd.gguf": build(meta=metadata(llama__block_count=As(U64, 1 << 40))),
        "head-count-zero.gguf": build(meta=metadata(llama__attention__head_count=0)),
        "head-count-absurd.gguf": build(meta=metadata(
            llama__attention__head_count=As(U64, 1 << 40),
            llama__attention__head_count_kv=As(U64, 1 << 40),
            llama__attention__key_length=As(U64, 1 << 40))),
        "key-length-absurd.gguf": build(
            meta=metadata(llama__attention__key_length=As(U64, (1 << 63) + 2))),
        "kv-heads-not-divisor.gguf": build(meta=metadata(llama__attention__head_count_kv=3)),
        "rope-dimension-odd.gguf": build(meta=metadata(llama__rope__dimension_count=As(U32, 15))),
        "rope-base-negative.gguf": build(meta=metadata(llama__rope__freq_base=-1.0)),
        "rope-base-nan.gguf": build(meta=metadata(llama__rope__freq_base=float("nan"))),
        "norm-eps-negative.gguf": build(
            meta=metadata(llama__attention__layer_norm_rms_epsilon=-1.0)),
        "context-length-zero.gguf": build(meta=metadata(llama__context_length=0)),
        "tokenizer-model-unknown.gguf": build(meta=metadata(tokenizer__ggml__model="wordpiece")),
        "tokens-missing.gguf": build(meta=metadata(tokenizer__ggml__tokens=None)),
        "tokens-not-strings.gguf": build(
            meta=metadata(tokenizer__ggml__tokens=(U32, list(range(VOCAB))))),
        "token-type-count-mismatch.gguf": build(
            meta=metadata(tokenizer__ggml__token_type=(I32, [1] * 3))),
        "bos-out-of-vocab.gguf": build(meta=metadata(tokenizer__ggml__bos_token_id=1 << 30)),
        "merge-not-pair.gguf": build(meta=metadata(tokenizer__ggml__merges=(STR, ["ab"]))),
        "vocab-larger-than-embedding.gguf": build(meta=metadata(
            tokenizer__ggml__tokens=(STR, tokens() + ["x", "y"]),
            tokenizer__ggml__token_type=(I32, [3] + [1] * (VOCAB + 1)))),
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    files = cases()
    for name, data in sorted(files.items()):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(files)} files to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
