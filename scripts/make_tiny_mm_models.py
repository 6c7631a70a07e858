#!/usr/bin/env python3
"""Tiny random-weight Qwen2-VL and Qwen2-Audio checkpoints, their inputs, and reference outputs.

How to run (from the repository root; CPU only, no network, about 15 s on 2 cores):

    python -m venv .venv-mmref && .venv-mmref/bin/pip install \
        torch==2.15.0 torchvision==0.29.2 transformers==5.24.0 tokenizers==0.23.3 \
        safetensors==0.8.0 pillow==13.0.0 numpy==2.4.6 regex jinja2
    .venv-mmref/bin/python scripts/make_tiny_mm_models.py

(any environment with those versions works; the script checks the transformers version and
refuses another one, because the reference outputs are what *that* version computes).

What it writes (everything under tests/data/, removed and rewritten on every run):

    tests/data/tiny-qwen2-vl/
        config.json                  hub (flat, 4.x) layout, as Qwen/Qwen2-VL-2B-Instruct ships it
        config.transformers-v5.json  the same config as transformers 5.24's save_pretrained writes it
        generation_config.json
        model.safetensors            f32, tensor names as on the hub (visual.*, model.*, lm_head.*)
        tokenizer.json, tokenizer_config.json, chat_template.jinja
        preprocessor_config.json     Qwen2VLImageProcessor
        video_preprocessor_config.json  Qwen2VLVideoProcessor
        processor_config.json        the processor settings as transformers 5.24 nests them
        media/*.png                  the images; media/video_80x60/frame_0N.png the video frames;
                                     media/resized/ the reference's resized images and frames
        reference.json               per case: prompt, input_ids, grids, pixel statistics,
                                     M-RoPE position ids, last-position logits, greedy tokens
    tests/data/tiny-qwen2-audio/
        config.json, generation_config.json, model.safetensors (names as on the hub:
        audio_tower.*, multi_modal_projector.*, language_model.*)
        tokenizer.json, tokenizer_config.json, chat_template.jinja (the same tokenizer as above)
        preprocessor_config.json     WhisperFeatureExtractor (128 mel bins, 16 kHz, 30 s chunks)
        processor_config.json
        media/*.wav                  16-bit mono 16 kHz clips
        reference.json               per case: prompt, input_ids, feature statistics, logits, ...

Everything is deterministic: fixed seeds, a BPE trainer written here (no hash-order ties),
one torch thread, no timestamps. Running the script twice gives byte-identical files.
Before finishing it reloads both folders with transformers and checks prompts, ids and logits.
tests/data/README.md describes the files, the processor behaviour, and what a parity test should
compare (with tolerances).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import shutil
import warnings
import wave
from collections import Counter
from pathlib import Path

import numpy as np
import regex
import torch
from PIL import Image

import transformers
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE
from transformers.image_processing_backends import TorchvisionBackend
from transformers.image_utils import SizeDict
from transformers import (
    Qwen2AudioConfig,
    Qwen2AudioForConditionalGeneration,
    Qwen2AudioProcessor,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
    TokenizersBackend,
    WhisperFeatureExtractor,
)

EXPECTED_TRANSFORMERS = "5.24.0"
SEED = 5  # issue 5
ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
VL_DIR = DATA / "tiny-qwen2-vl"
AUDIO_DIR = DATA / "tiny-qwen2-audio"

# --------------------------------------------------------------------------------------------
# Tokenizer: byte-level BPE in Qwen2's layout, trained here on a small corpus written for it.
# --------------------------------------------------------------------------------------------

# The pre-tokenizer split of Qwen2's tokenizer.json (the same expression transformers' Qwen2Tokenizer
# and the hub's tokenizer.json use), so the tiny tokenizer exercises the same code paths.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CORPUS = """\
You are a helpful assistant. Describe this image. Describe the picture in one sentence.
What is in the video? What is different between these two pictures? What sound is this?
Listen to the audio and tell me what you hear. Answer in a few words, please.

The small harbour town wakes up before the sun. Fishing boats leave the quay one after
another, their engines humming low over the water. A red boat and a blue boat pass the
lighthouse, and the gulls follow them out to sea. On the hill above the harbour there is a
white house with a green door, and in its garden a dog sleeps in the shade of an old tree.

In the afternoon the wind turns. Clouds come in from the west, grey and heavy, and the first
drops of rain fall on the stones of the market square. People open their umbrellas. A child
in a yellow coat jumps into every puddle she can find, laughing, while her father waits
under the roof of the bakery with two loaves of bread and a bag of apples.

Pictures are made of pixels, and every pixel has a colour: red, green and blue mixed in
different amounts. A square can be bright or dark; a line can be straight or curved; a
circle has no corners at all. When a picture moves, it becomes a video: many frames, one
after the other, each a little different from the one before. When the air moves, it
becomes a sound: a tone that is high or low, loud or quiet, short or long.

The clock on the tower strikes four. A bell rings, a train whistles in the distance, and a
radio plays a song with a slow piano and a soft voice. The tone of the song is calm. Then a
drum starts, faster and louder, and the music changes. Somebody claps. Somebody sings.

Count with me: one, two, three, four, five, six, seven, eight, nine, ten. The numbers 1, 2,
3, 4, 5, 6, 7, 8, 9 and 0 make every other number. Twelve is more than ten; a hundred is
more than twelve. The left side of the image is darker than the right side, and the top is
brighter than the bottom. There is a square in the middle and a stripe across the corner.

The assistant looks at the picture and says what it sees. It reads the question, thinks
about the answer, and writes it down in plain words. If it does not know, it says so. It
does not guess the name of a person. It tells the user about the colours, the shapes, the
light and the movement, and about the sounds in the audio clip: a hum, a whistle, a beep.
"""

# Ids follow the BPE vocabulary, in this order (Qwen2's own order of these tokens).
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
BPE_VOCAB_SIZE = 736  # 256 byte tokens + 480 merged tokens
MODEL_VOCAB_SIZE = 768  # the embedding/lm_head rows: padded past the 747 tokenizer ids, as Qwen does


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, which ByteLevel pre-tokenizers use."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def train_bpe(text: str, vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Plain BPE on byte-level pieces. Ties go to the lexicographically smallest pair, so the
    result depends on nothing but the text."""
    to_char = byte_to_unicode()
    vocab = {to_char[b]: b for b in range(256)}
    pieces = regex.findall(QWEN2_SPLIT, text)
    words: dict[tuple[str, ...], int] = Counter(tuple(to_char[b] for b in p.encode("utf-8")) for p in pieces)
    merges: list[tuple[str, str]] = []
    while len(vocab) < vocab_size:
        pairs: Counter = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            raise SystemExit("the corpus is too small for the requested vocabulary")
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        if joined not in vocab:
            vocab[joined] = len(vocab)
        merged: dict[tuple[str, ...], int] = {}
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + count
        words = merged
    return vocab, merges


def build_backend_tokenizer() -> Tokenizer:
    vocab, merges = train_bpe(CORPUS, BPE_VOCAB_SIZE)
    tok = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    assert tok.get_vocab_size(with_added_tokens=True) == BPE_VOCAB_SIZE + len(SPECIAL_TOKENS)
    return tok


# The chat template (Jinja; renders the same in jinja2 and minijinja). Content parts are
# recognised by "type" (OpenAI's image_url / input_audio, vLLM's video_url / audio_url, and
# the plain image / video / audio of HF-style messages) or, without a type, by their key.
# Images and videos render as Qwen2-VL's template renders them, audio as Qwen2-Audio's does;
# a default system turn is added when the first message is not a system message.
CHAT_TEMPLATE = """\
{%- set counts = namespace(image=0, video=0, audio=0) -%}
{%- for message in messages -%}
    {%- if loop.first and message['role'] != 'system' -%}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}
    {%- endif -%}
    {{- '<|im_start|>' + message['role'] + '\\n' -}}
    {%- if message['content'] is string -%}
        {{- message['content'] -}}
    {%- else -%}
        {%- for part in message['content'] -%}
            {%- if part['type'] is defined -%}{%- set kind = part['type'] -%}
            {%- elif 'text' in part -%}{%- set kind = 'text' -%}
            {%- elif 'image' in part or 'image_url' in part -%}{%- set kind = 'image' -%}
            {%- elif 'video' in part or 'video_url' in part -%}{%- set kind = 'video' -%}
            {%- elif 'audio' in part or 'audio_url' in part or 'input_audio' in part -%}{%- set kind = 'audio' -%}
            {%- else -%}{%- set kind = '' -%}
            {%- endif -%}
            {%- if kind == 'image' or kind == 'image_url' -%}
                {%- set counts.image = counts.image + 1 -%}
                {%- if add_vision_id -%}{{- 'Picture ' + counts.image|string + ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif kind == 'video' or kind == 'video_url' -%}
                {%- set counts.video = counts.video + 1 -%}
                {%- if add_vision_id -%}{{- 'Video ' + counts.video|string + ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
            {%- elif kind == 'audio' or kind == 'audio_url' or kind == 'input_audio' -%}
                {%- set counts.audio = counts.audio + 1 -%}
                {{- 'Audio ' + counts.audio|string + ': <|audio_bos|><|AUDIO|><|audio_eos|>\\n' -}}
            {%- elif kind == 'text' -%}
                {{- part['text'] -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""


def build_tokenizer() -> TokenizersBackend:
    return TokenizersBackend(
        tokenizer_object=build_backend_tokenizer(),
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=32768,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------

def pattern_image(width: int, height: int, variant: int) -> np.ndarray:
    """Integer-only RGB pattern: two gradients, a checkerboard, a square and a diagonal stripe."""
    y, x = np.mgrid[0:height, 0:width].astype(np.int64)
    r = (x * 255) // max(width - 1, 1)
    g = (y * 255) // max(height - 1, 1)
    b = np.where(((x // 8) + (y // 8) + variant) % 2 == 0, 40, 200)
    cx, cy, half = width // 2 + 5 * variant, height // 2, min(width, height) // 5
    square = (abs(x - cx) <= half) & (abs(y - cy) <= half)
    r = np.where(square, 255 - r, r)
    g = np.where(square, (g + 96 * (variant + 1)) % 256, g)
    stripe = abs((x + 2 * y) % 37 - 18) <= 2
    b = np.where(stripe, (b + 120) % 256, b)
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def video_frames(count: int, width: int, height: int) -> np.ndarray:
    """A square moving right across a slowly shifting gradient: (T, H, W, 3) uint8."""
    frames = []
    y, x = np.mgrid[0:height, 0:width].astype(np.int64)
    for t in range(count):
        r = ((x + 6 * t) * 255 // (width + 6 * count)) % 256
        g = (y * 200) // max(height - 1, 1) + 20 * (t % 3)
        b = np.full_like(x, 60 + 20 * t)
        box = (x >= 4 + 8 * t) & (x < 20 + 8 * t) & (y >= 18) & (y < 34)
        r = np.where(box, 250, r)
        g = np.where(box, 250 - 25 * t, g)
        b = np.where(box, 10, b)
        frames.append(np.stack([r, g, b], axis=-1).astype(np.uint8))
    return np.stack(frames)


def tone(num_samples: int, parts: list[tuple[float, float]], fade: int = 160) -> np.ndarray:
    """A sum of sines (Hz, amplitude) with linear fades, as int16 samples at 16 kHz."""
    t = np.arange(num_samples, dtype=np.float64) / 16000.0
    signal = np.zeros(num_samples, dtype=np.float64)
    for hz, amp in parts:
        signal += amp * np.sin(2.0 * math.pi * hz * t)
    # A slow tremolo, so frames differ from each other.
    signal *= 0.75 + 0.25 * np.sin(2.0 * math.pi * 3.0 * t)
    env = np.ones(num_samples)
    ramp = np.arange(fade, dtype=np.float64) / fade
    env[:fade] = ramp
    env[-fade:] = ramp[::-1]
    return np.round(signal * env * 32767.0).astype(np.int16)


def write_png(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, mode="RGB").save(path, format="PNG", optimize=False, compress_level=9)


def read_png(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def write_wav(path: Path, samples: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(samples.astype("<i2").tobytes())


def read_wav(path: Path) -> np.ndarray:
    """Decoded as soundfile / librosa decode 16-bit PCM: int16 / 32768 as float32."""
    with wave.open(str(path), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
        raw = w.readframes(w.getnframes())
    return (np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Weights and numbers
# --------------------------------------------------------------------------------------------

NORM_WEIGHT_SUFFIXES = ("norm.weight", "norm1.weight", "norm2.weight", "ln_q.weight", "layer_norm.weight")


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn from one generator, in sorted-name order: matrices N(0, 1/fan_in),
    embeddings N(0, 1), norm weights 1 + N(0, 0.1^2), biases N(0, 0.05^2). The scale keeps
    activations O(1) so logits are spread out (std ~1) rather than all near zero."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            shape = tuple(param.shape)
            noise = torch.randn(shape, generator=gen, dtype=torch.float64)
            if name.endswith(NORM_WEIGHT_SUFFIXES) or (len(shape) == 1 and "norm" in name):
                value = 1.0 + 0.1 * noise
            elif len(shape) == 1:
                value = 0.05 * noise
            elif "embed_tokens" in name:
                value = noise
            elif "embed_positions" in name:
                value = 0.5 * noise
            else:
                fan_in = int(np.prod(shape[1:]))
                value = noise / math.sqrt(fan_in)
            param.copy_(value.to(param.dtype))


def f32(values) -> list[float]:
    """float32 values as the shortest decimal that parses back to the same float32."""
    arr = np.asarray(values, dtype=np.float32).reshape(-1)
    return [float(str(v)) for v in arr]


def stats(tensor: torch.Tensor, first: int = 16) -> dict:
    arr = tensor.detach().to(torch.float32).numpy()
    wide = arr.astype(np.float64)
    return {
        "shape": list(arr.shape),
        "sum": float(wide.sum()),
        "sum_sq": float((wide * wide).sum()),
        "first16": f32(arr.reshape(-1)[:first]),
    }


def logits_summary(last: torch.Tensor) -> dict:
    values = last.detach().to(torch.float32)
    top = torch.topk(values, 5)
    return {
        "logits_last": f32(values.numpy()),
        "top5_ids": [int(i) for i in top.indices],
        "top5_logits": f32(top.values.numpy()),
        "top1_top2_margin": float(str(np.float32(top.values[0] - top.values[1]))),
    }


def greedy(model, inputs: dict, steps: int = 4) -> dict:
    out = model.generate(
        **inputs,
        max_new_tokens=steps,
        min_new_tokens=steps,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    new = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    margins = []
    for token, step in zip(new, out.logits):
        v = torch.topk(step[0].float(), 2)
        # min_new_tokens only masks EOS; the choice must be the plain argmax of the raw logits.
        assert int(v.indices[0]) == token
        margins.append(float(str(np.float32(v.values[0] - v.values[1]))))
    return {"new_tokens": new, "margins": margins}


def to_json(value) -> str:
    """Indented JSON with every list of plain numbers on one line."""
    text = json.dumps(value, indent=1, ensure_ascii=False)
    return re.sub(r"\[([\s0-9eE+\-.,]*)\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)).strip() + "]", text) + "\n"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------------------------
# Qwen2-VL
# --------------------------------------------------------------------------------------------

VL_TEXT = dict(
    vocab_size=MODEL_VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_act="silu",
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    mrope_section=[4, 2, 2],  # sums to head_dim / 2 = 8
)
VL_VISION = dict(
    depth=2,
    embed_dim=32,
    num_heads=2,
    mlp_ratio=2,
    hidden_act="quick_gelu",
    in_chans=3,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    hidden_size=64,
)


def vl_hub_config(tok) -> dict:
    """config.json as the hub's Qwen2-VL checkpoints lay it out (text fields at the top)."""
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    t = VL_TEXT
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "attention_dropout": 0.0,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "vision_token_id": ids["<|vision_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "hidden_act": t["hidden_act"],
        "hidden_size": t["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": t["intermediate_size"],
        "max_position_embeddings": t["max_position_embeddings"],
        "max_window_layers": t["num_hidden_layers"],
        "model_type": "qwen2_vl",
        "num_attention_heads": t["num_attention_heads"],
        "num_hidden_layers": t["num_hidden_layers"],
        "num_key_value_heads": t["num_key_value_heads"],
        "rms_norm_eps": t["rms_norm_eps"],
        "rope_theta": t["rope_theta"],
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": transformers.__version__,
        "use_cache": True,
        "use_sliding_window": False,
        "vision_config": {
            "depth": VL_VISION["depth"],
            "embed_dim": VL_VISION["embed_dim"],
            "mlp_ratio": VL_VISION["mlp_ratio"],
            "num_heads": VL_VISION["num_heads"],
            "in_chans": VL_VISION["in_chans"],
            "hidden_act": VL_VISION["hidden_act"],
            "hidden_size": VL_VISION["hidden_size"],
            "patch_size": VL_VISION["patch_size"],
            "spatial_merge_size": VL_VISION["spatial_merge_size"],
            "spatial_patch_size": VL_VISION["patch_size"],
            "temporal_patch_size": VL_VISION["temporal_patch_size"],
        },
        "rope_scaling": {"type": "mrope", "mrope_section": t["mrope_section"]},
        "vocab_size": t["vocab_size"],
    }


# The hub's Qwen2-VL preprocessor_config.json values (the class default max is 28*28*1280).
VL_MIN_PIXELS = 56 * 56
VL_MAX_PIXELS = 14 * 14 * 4 * 16384


def vl_processors(tok) -> Qwen2VLProcessor:
    common = dict(
        min_pixels=VL_MIN_PIXELS,
        max_pixels=VL_MAX_PIXELS,
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
    )
    image = Qwen2VLImageProcessor(**common)
    # The class default for videos is min 128*28*28 / max 768*28*28 pixels; the hub's Qwen2-VL
    # checkpoints carry one preprocessor_config.json whose min/max apply to videos too, so
    # the tiny checkpoint states the image values explicitly (frames stay small).
    video = Qwen2VLVideoProcessor(**common, cap_pixels_per_frame=False)
    return Qwen2VLProcessor(image_processor=image, tokenizer=tok, video_processor=video, chat_template=CHAT_TEMPLATE)


def legacy_rope_index(input_ids: list[int], grids: list[tuple[str, list[int]]], image_id: int, video_id: int,
                      merge: int) -> list[list[int]]:
    """Qwen2-VL's M-RoPE positions as transformers 4.x and vLLM compute them: text after a vision
    block continues at (largest position in the block) + 1, i.e. start + max(t, h/m, w/m)."""
    pos = [[], [], []]
    i, nxt, g = 0, 0, iter(grids)
    while i < len(input_ids):
        if input_ids[i] in (image_id, video_id):
            _, (t, h, w) = next(g)
            lh, lw = h // merge, w // merge
            for ti in range(t):
                for hi in range(lh):
                    for wi in range(lw):
                        pos[0].append(nxt + ti)
                        pos[1].append(nxt + hi)
                        pos[2].append(nxt + wi)
            i += t * lh * lw
            nxt = nxt + max(t, lh, lw)
        else:
            for axis in pos:
                axis.append(nxt)
            nxt += 1
            i += 1
    return pos


def pil_stats(images, kwargs) -> dict:
    """The same images through transformers' PIL-backend image processor (PIL's bicubic instead of
    torchvision's). Not the reference: it shows how far a correct PIL-style resize may land."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    pil = Qwen2VLImageProcessorPil(min_pixels=VL_MIN_PIXELS, max_pixels=VL_MAX_PIXELS)
    keep = {k: v for k, v in kwargs.items() if k in ("min_pixels", "max_pixels")}
    return stats(pil(images, return_tensors="pt", **keep)["pixel_values"])


def export_resized(processor, item: dict, ph: dict) -> dict:
    """The reference's resized uint8 image (or sampled video frames) as PNGs under media/resized/,
    so a parity test can feed the model exactly the reference pixel values without depending on
    its own bicubic resize. Frames are listed in processing order, before temporal padding."""
    _, gh, gw = ph["grid_thw"]
    patch = processor.image_processor.patch_size
    height, width = gh * patch, gw * patch
    if ph["kind"] == "image":
        sources = [item["file"]]
        names = [f"resized/{Path(item['file']).stem}_{width}x{height}.png"]
    else:
        sources = [item["frames"][k] for k in ph["frame_indices"]]
        names = [f"resized/{Path(f).parent.name}_{width}x{height}/{Path(f).name}" for f in sources]
    for source, name in zip(sources, names):
        chw = torch.from_numpy(read_png(VL_DIR / source).copy()).permute(2, 0, 1).contiguous()
        out = TorchvisionBackend.resize(
            processor.image_processor, chw, SizeDict(height=height, width=width), resample=processor.image_processor.resample
        )
        assert out.dtype == torch.uint8
        path = VL_DIR / "media" / name
        if not path.exists():
            write_png(path, out.permute(1, 2, 0).numpy())
    return {"height": height, "width": width, "files": [f"media/{n}" for n in names]}


def check_resized_round_trip(processor, prompt, inputs, placeholders) -> None:
    """The exported resized media, processed with min_pixels/max_pixels that make smart_resize the
    identity, give bit-identical pixel values: resize is the only step they skip."""
    areas = [ph["resized"]["height"] * ph["resized"]["width"] for ph in placeholders]
    images = [Image.fromarray(read_png(VL_DIR / ph["resized"]["files"][0]), mode="RGB")
              for ph in placeholders if ph["kind"] == "image"]
    videos = [np.stack([read_png(VL_DIR / f) for f in ph["resized"]["files"]])
              for ph in placeholders if ph["kind"] == "video"]
    again = processor(text=[prompt], images=images or None, videos=videos or None, return_tensors="pt",
                      min_pixels=min(areas), max_pixels=max(areas))
    assert again["input_ids"].tolist() == inputs["input_ids"].tolist()
    for key in ("pixel_values", "pixel_values_videos", "image_grid_thw", "video_grid_thw"):
        assert (key in again) == (key in inputs), key
        if key in inputs:
            assert torch.equal(again[key], inputs[key]), key


def run_vl(tok) -> None:
    media = VL_DIR / "media"
    images = {
        "image_64x48.png": pattern_image(64, 48, 0),
        "image_100x76.png": pattern_image(100, 76, 1),
        "image_84x56.png": pattern_image(84, 56, 2),
        "image_400x10.png": pattern_image(400, 10, 3),
    }
    for name, px in images.items():
        write_png(media / name, px)
    frames = video_frames(8, 80, 60)
    frame_files = [f"video_80x60/frame_{i:02d}.png" for i in range(len(frames))]
    for name, px in zip(frame_files, frames):
        write_png(media / name, px)

    media_table = {
        "image_64x48": {"kind": "image", "file": "media/image_64x48.png", "width": 64, "height": 48},
        "image_100x76": {"kind": "image", "file": "media/image_100x76.png", "width": 100, "height": 76},
        "image_84x56": {"kind": "image", "file": "media/image_84x56.png", "width": 84, "height": 56},
        "image_400x10": {"kind": "image", "file": "media/image_400x10.png", "width": 400, "height": 10},
        "video_80x60": {
            "kind": "video",
            "frames": [f"media/{f}" for f in frame_files],
            "width": 80,
            "height": 60,
            "fps": 4.0,
            "note": "8 frames; fps is the nominal source rate given to the processor as video metadata",
        },
        "video_80x60_first5": {
            "kind": "video",
            "frames": [f"media/{f}" for f in frame_files[:5]],
            "width": 80,
            "height": 60,
            "fps": 4.0,
            "note": "the first 5 frames of video_80x60: an odd count, padded by repeating the last frame",
        },
    }

    def load(ref: str):
        item = media_table[ref]
        if item["kind"] == "image":
            return Image.fromarray(read_png(VL_DIR / item["file"]), mode="RGB")
        return np.stack([read_png(VL_DIR / f) for f in item["frames"]])

    def image_part(ref):
        return {"type": "image_url", "image_url": {"url": media_table[ref]["file"]}}

    def video_part(ref):
        return {"type": "video_url", "video_url": {"url": ref}}

    def text(s):
        return {"type": "text", "text": s}

    cases = [
        {
            "name": "image_single",
            "about": "one 64x48 image, default processor settings (smart_resize upscales to 56x56)",
            "messages": [{"role": "user", "content": [image_part("image_64x48"), text("Describe this image.")]}],
            "media": ["image_64x48"],
            "kwargs": {},
        },
        {
            "name": "image_no_resize",
            "about": "84x56 is already a multiple of 28: no resize, pixel values exact (grid 1x4x6, 6 tokens)",
            "messages": [{"role": "user", "content": [text("What colour is the square? "), image_part("image_84x56")]}],
            "media": ["image_84x56"],
            "kwargs": {},
        },
        {
            "name": "image_two_with_system",
            "about": "two images in one turn (84x56 needs no resize; 100x76 resizes to 84x112) after a system turn",
            "messages": [
                {"role": "system", "content": "You are a careful assistant."},
                {
                    "role": "user",
                    "content": [
                        text("What is different between these two pictures? "),
                        image_part("image_84x56"),
                        image_part("image_100x76"),
                    ],
                },
            ],
            "media": ["image_84x56", "image_100x76"],
            "kwargs": {},
        },
        {
            "name": "image_max_pixels",
            "about": "max_pixels=3136 shrinks 100x76 to 56x28: grid 1x2x4, 2 tokens",
            "messages": [{"role": "user", "content": [image_part("image_100x76"), text("What is in the picture?")]}],
            "media": ["image_100x76"],
            "kwargs": {"max_pixels": 3136},
        },
        {
            "name": "image_min_pixels",
            "about": "min_pixels=12544 grows 64x48 to 140x112: grid 1x8x10, 20 tokens",
            "messages": [{"role": "user", "content": [image_part("image_64x48"), text("Describe the picture in one sentence.")]}],
            "media": ["image_64x48"],
            "kwargs": {"min_pixels": 12544},
        },
        {
            "name": "image_thin",
            "about": "400x10: the height rounds to 0 in smart_resize's first step, so the min_pixels branch "
                     "sizes it: 364x28, grid 1x2x26, 13 tokens (clamping the rounded side to 28 first gives 392x28)",
            "messages": [{"role": "user", "content": [image_part("image_400x10"), text("What is this?")]}],
            "media": ["image_400x10"],
            "kwargs": {},
        },
        {
            "name": "video_all_frames",
            "about": "all 8 frames (no sampling): 80x60 resizes to 84x56, grid 4x4x6, 24 tokens",
            "messages": [{"role": "user", "content": [video_part("video_80x60"), text("What is in the video?")]}],
            "media": ["video_80x60"],
            "kwargs": {},
        },
        {
            "name": "video_num_frames_4",
            "about": "do_sample_frames with num_frames=4 picks frames 0,2,4,6: grid 2x4x6, 12 tokens",
            "messages": [{"role": "user", "content": [text("Describe the video. "), video_part("video_80x60")]}],
            "media": ["video_80x60"],
            "kwargs": {"do_sample_frames": True, "num_frames": 4},
        },
        {
            "name": "video_fps_3",
            "about": "do_sample_frames with fps=3 at a 4 fps source: 6 frames (0,1,2,4,5,6), grid 3x4x6, 18 tokens",
            "messages": [{"role": "user", "content": [video_part("video_80x60"), text("What moves?")]}],
            "media": ["video_80x60"],
            "kwargs": {"do_sample_frames": True, "fps": 3},
            "video_metadata": True,
        },
        {
            "name": "video_odd_frames",
            "about": "5 frames, no sampling: the last frame repeats to make 6, grid 3x4x6, 18 tokens",
            "messages": [{"role": "user", "content": [video_part("video_80x60_first5"), text("What is in the video?")]}],
            "media": ["video_80x60_first5"],
            "kwargs": {},
        },
        {
            "name": "image_then_video",
            "about": "an image and a video (num_frames=4) in one turn: M-RoPE across two vision blocks",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        image_part("image_64x48"),
                        text("This is the first frame. "),
                        video_part("video_80x60"),
                        text("Does the video match the picture?"),
                    ],
                }
            ],
            "media": ["image_64x48", "video_80x60"],
            "kwargs": {"do_sample_frames": True, "num_frames": 4},
        },
    ]

    torch.manual_seed(SEED)
    processor = vl_processors(tok)
    hub_cfg = vl_hub_config(tok)
    config = Qwen2VLConfig(**{k: v for k, v in hub_cfg.items() if k not in ("transformers_version",)})
    model = Qwen2VLForConditionalGeneration(config).eval()
    randomise(model, SEED)
    model64 = copy.deepcopy(model).double()

    # Files: tokenizer + processor configs via save_pretrained, weights and config.json by hand.
    processor.save_pretrained(VL_DIR)
    model.generation_config.do_sample = False
    model.save_pretrained(VL_DIR / "_v5")
    shutil.move(str(VL_DIR / "_v5" / "config.json"), VL_DIR / "config.transformers-v5.json")
    shutil.move(str(VL_DIR / "_v5" / "generation_config.json"), VL_DIR / "generation_config.json")
    shutil.rmtree(VL_DIR / "_v5")
    state = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("model.visual."):
            hub = "visual." + name[len("model.visual."):]
        elif name.startswith("model.language_model."):
            hub = "model." + name[len("model.language_model."):]
        else:
            hub = name
        state[hub] = tensor.detach().to(torch.float32).contiguous()
    save_file(dict(sorted(state.items())), str(VL_DIR / "model.safetensors"), metadata={"format": "pt"})
    (VL_DIR / "config.json").write_text(json.dumps(hub_cfg, indent=2) + "\n")
    finish_tokenizer_files(VL_DIR)
    pixels = {"min_pixels": VL_MIN_PIXELS, "max_pixels": VL_MAX_PIXELS, "processor_class": "Qwen2VLProcessor"}
    write_json(VL_DIR / "preprocessor_config.json", {**processor.image_processor.to_dict(), **pixels})
    write_json(VL_DIR / "video_preprocessor_config.json", {**processor.video_processor.to_dict(), **pixels})

    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    video_id = tok.convert_tokens_to_ids("<|video_pad|>")
    merge = VL_VISION["spatial_merge_size"]
    results = []
    for case in cases:
        prompt = tok.apply_chat_template(case["messages"], tokenize=False, add_generation_prompt=True)
        images_in = [load(r) for r in case["media"] if media_table[r]["kind"] == "image"]
        videos_in = [load(r) for r in case["media"] if media_table[r]["kind"] == "video"]
        call = dict(case["kwargs"])
        if case.get("video_metadata"):
            call["video_metadata"] = [
                {"total_num_frames": len(v), "fps": media_table[r]["fps"]}
                for r, v in zip([r for r in case["media"] if media_table[r]["kind"] == "video"], videos_in)
            ]
        inputs = processor(
            text=[prompt],
            images=images_in or None,
            videos=videos_in or None,
            return_tensors="pt",
            return_metadata=True,
            **call,
        )
        sampled = [list(map(int, m.frames_indices)) for m in inputs.pop("video_metadata", None) or []]
        ids = inputs["input_ids"][0].tolist()

        # Placeholder runs, in order, with the grid each belongs to.
        grids = []
        gi = iter(inputs["image_grid_thw"].tolist()) if "image_grid_thw" in inputs else iter(())
        gv = iter(inputs["video_grid_thw"].tolist()) if "video_grid_thw" in inputs else iter(())
        placeholders = []
        i = 0
        refs = iter(case["media"])
        while i < len(ids):
            if ids[i] in (image_id, video_id):
                kind = "image" if ids[i] == image_id else "video"
                j = i
                while j < len(ids) and ids[j] == ids[i]:
                    j += 1
                grid = next(gi) if kind == "image" else next(gv)
                grids.append((kind, grid))
                assert j - i == grid[0] * grid[1] * grid[2] // (merge * merge)
                placeholders.append({"media": next(refs), "kind": kind, "start": i, "tokens": j - i, "grid_thw": grid})
                i = j
            else:
                i += 1
        sampled_iter = iter(sampled)
        for ph in placeholders:
            if ph["kind"] == "video":
                ph["frame_indices"] = next(sampled_iter)
            ph["resized"] = export_resized(processor, media_table[ph["media"]], ph)
        check_resized_round_trip(processor, prompt, inputs, placeholders)

        forward = {k: v for k, v in inputs.items() if k != "attention_mask"}
        with torch.no_grad():
            position_ids, deltas = model.model.get_rope_index(
                inputs["input_ids"],
                mm_token_type_ids=inputs["mm_token_type_ids"],
                image_grid_thw=inputs.get("image_grid_thw"),
                video_grid_thw=inputs.get("video_grid_thw"),
            )
            model.model.rope_deltas = None
            out = model(**forward)
            model64.model.rope_deltas = None
            f64_inputs = {k: (v.double() if v.is_floating_point() else v) for k, v in forward.items()}
            out64 = model64(**f64_inputs)
            embeds = {}
            if "pixel_values" in inputs:
                feats = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
                embeds["image"] = stats(torch.cat(feats.pooler_output, dim=0))
            if "pixel_values_videos" in inputs:
                feats = model.model.get_video_features(inputs["pixel_values_videos"], inputs["video_grid_thw"])
                embeds["video"] = stats(torch.cat(feats.pooler_output, dim=0))
        last = out.logits[0, -1]
        record = {
            "name": case["name"],
            "about": case["about"],
            "messages": case["messages"],
            "media": case["media"],
            "chat_template_kwargs": {"add_generation_prompt": True},
            "processor_kwargs": case["kwargs"],
            "video_metadata": call.get("video_metadata"),
            "prompt": prompt,
            "num_tokens": len(ids),
            "input_ids": ids,
            "placeholders": placeholders,
            "image_grid_thw": inputs["image_grid_thw"].tolist() if "image_grid_thw" in inputs else None,
            "video_grid_thw": inputs["video_grid_thw"].tolist() if "video_grid_thw" in inputs else None,
            "pixel_values": stats(inputs["pixel_values"]) if "pixel_values" in inputs else None,
            "pixel_values_pil_backend": pil_stats(images_in, case["kwargs"]) if images_in else None,
            "pixel_values_videos": stats(inputs["pixel_values_videos"]) if "pixel_values_videos" in inputs else None,
            "vision_embeds": embeds,
            "position_ids": position_ids[:, 0, :].tolist(),
            "rope_delta": int(deltas.reshape(-1)[0]),
        }
        record.update(logits_summary(last))
        record["logits_last_f64_max_abs_diff"] = float((out64.logits[0, -1] - last.double()).abs().max())

        legacy = legacy_rope_index(ids, grids, image_id, video_id, merge)
        if legacy != record["position_ids"]:
            with torch.no_grad():
                pos = torch.tensor(legacy, dtype=torch.long)[:, None, :]
                model.model.rope_deltas = None
                legacy_out = model(**forward, position_ids=pos)
            record["position_ids_transformers4"] = legacy
            record["transformers4"] = logits_summary(legacy_out.logits[0, -1])

        model.model.rope_deltas = None
        with torch.no_grad():
            record["greedy"] = greedy(model, dict(forward, attention_mask=inputs["attention_mask"]))
        results.append(record)

    check_reload_vl(results, processor, media_table, load)
    reference = {
        "generated_by": "scripts/make_tiny_mm_models.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "model": "tiny-qwen2-vl (random weights)",
        "special_token_ids": {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS},
        "media": media_table,
        "cases": results,
    }
    (VL_DIR / "reference.json").write_text(to_json(reference))


def check_reload_vl(results, processor, media_table, load) -> None:
    """The written folder loads in transformers (hub config + hub tensor names) and gives the
    same ids and logits as the in-memory model."""
    from transformers import AutoProcessor

    model = Qwen2VLForConditionalGeneration.from_pretrained(VL_DIR, dtype=torch.float32).eval()
    proc = AutoProcessor.from_pretrained(VL_DIR)
    for cls, file, mine in (
        (Qwen2VLImageProcessor, "preprocessor_config.json", processor.image_processor),
        (Qwen2VLVideoProcessor, "video_preprocessor_config.json", processor.video_processor),
    ):
        loaded = cls.from_dict(json.loads((VL_DIR / file).read_text()))
        assert loaded.to_dict() == mine.to_dict(), file
        assert cls.from_pretrained(VL_DIR).to_dict() == mine.to_dict(), file
    for record in results:
        call = dict(record["processor_kwargs"])
        if record["video_metadata"]:
            call["video_metadata"] = record["video_metadata"]
        prompt = proc.apply_chat_template(record["messages"], tokenize=False, add_generation_prompt=True)
        assert prompt == record["prompt"], record["name"]
        imgs = [load(r) for r in record["media"] if media_table[r]["kind"] == "image"]
        vids = [load(r) for r in record["media"] if media_table[r]["kind"] == "video"]
        inputs = proc(text=[prompt], images=imgs or None, videos=vids or None, return_tensors="pt", **call)
        assert inputs["input_ids"][0].tolist() == record["input_ids"], record["name"]
        with torch.no_grad():
            model.model.rope_deltas = None
            out = model(**{k: v for k, v in inputs.items() if k != "attention_mask"})
        assert f32(out.logits[0, -1].numpy()) == record["logits_last"], record["name"]


# --------------------------------------------------------------------------------------------
# Qwen2-Audio
# --------------------------------------------------------------------------------------------

AUDIO_ENCODER = dict(
    model_type="qwen2_audio_encoder",
    num_mel_bins=128,
    d_model=32,
    encoder_layers=2,
    encoder_attention_heads=2,
    encoder_ffn_dim=64,
    max_source_positions=1500,
    activation_function="gelu",
    scale_embedding=False,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
    encoder_layerdrop=0.0,
)
AUDIO_TEXT = dict(
    model_type="qwen2",
    vocab_size=MODEL_VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_act="silu",
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    use_sliding_window=False,
)


def run_audio(tok) -> None:
    media = AUDIO_DIR / "media"
    clips = {
        "tone_2s.wav": tone(32000, [(440.0, 0.30), (1000.0, 0.15), (2500.0, 0.05)]),
        "tone_short.wav": tone(19751, [(300.0, 0.25), (1800.0, 0.20)]),
    }
    for name, samples in clips.items():
        write_wav(media / name, samples)
    media_table = {
        "tone_2s": {"kind": "audio", "file": "media/tone_2s.wav", "samples": 32000, "sample_rate": 16000},
        "tone_short": {"kind": "audio", "file": "media/tone_short.wav", "samples": 19751, "sample_rate": 16000},
    }

    def audio_part(ref):
        return {"type": "audio_url", "audio_url": {"url": media_table[ref]["file"]}}

    def text(s):
        return {"type": "text", "text": s}

    cases = [
        {
            "name": "audio_single",
            "about": "one 2 s clip: 200 mel frames -> 50 audio tokens",
            "messages": [{"role": "user", "content": [audio_part("tone_2s"), text("What sound is this?")]}],
            "media": ["tone_2s"],
        },
        {
            "name": "audio_two_clips",
            "about": "two clips in one turn; 19751 samples -> 124 mel frames -> 31 tokens",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        text("Listen to both clips. "),
                        audio_part("tone_2s"),
                        audio_part("tone_short"),
                        text("Which one is higher?"),
                    ],
                }
            ],
            "media": ["tone_2s", "tone_short"],
        },
        {
            "name": "audio_multi_turn",
            "about": "system turn, an audio turn, an assistant answer, then a text-only question",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": [audio_part("tone_short"), text("What do you hear?")]},
                {"role": "assistant", "content": "A low tone and a high tone."},
                {"role": "user", "content": "Is it loud or quiet?"},
            ],
            "media": ["tone_short"],
        },
    ]

    torch.manual_seed(SEED)
    feature_extractor = WhisperFeatureExtractor(
        feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=30, n_fft=400, padding_value=0.0,
        return_attention_mask=True,
    )
    processor = Qwen2AudioProcessor(feature_extractor=feature_extractor, tokenizer=tok, chat_template=CHAT_TEMPLATE)
    audio_token = tok.convert_tokens_to_ids("<|AUDIO|>")
    config = Qwen2AudioConfig(
        audio_config=dict(AUDIO_ENCODER),
        text_config=dict(
            AUDIO_TEXT,
            bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
            eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        ),
        audio_token_index=audio_token,
    )
    model = Qwen2AudioForConditionalGeneration(config).eval()
    randomise(model, SEED + 1)
    model64 = copy.deepcopy(model).double()

    processor.save_pretrained(AUDIO_DIR)
    model.generation_config.do_sample = False
    model.save_pretrained(AUDIO_DIR / "_v5")
    shutil.move(str(AUDIO_DIR / "_v5" / "generation_config.json"), AUDIO_DIR / "generation_config.json")
    v5_config = json.loads((AUDIO_DIR / "_v5" / "config.json").read_text())
    shutil.rmtree(AUDIO_DIR / "_v5")
    (AUDIO_DIR / "config.json").write_text(json.dumps(audio_hub_config(v5_config), indent=2) + "\n")
    state = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("model.audio_tower."):
            hub = "audio_tower." + name[len("model.audio_tower."):]
        elif name.startswith("model.multi_modal_projector."):
            hub = "multi_modal_projector." + name[len("model.multi_modal_projector."):]
        elif name.startswith("model.language_model."):
            hub = "language_model.model." + name[len("model.language_model."):]
        elif name.startswith("lm_head."):
            hub = "language_model." + name
        else:
            raise SystemExit(f"unexpected tensor {name}")
        state[hub] = tensor.detach().to(torch.float32).contiguous()
    save_file(dict(sorted(state.items())), str(AUDIO_DIR / "model.safetensors"), metadata={"format": "pt"})
    finish_tokenizer_files(AUDIO_DIR)
    write_json(
        AUDIO_DIR / "preprocessor_config.json",
        {**feature_extractor.to_dict(), "processor_class": "Qwen2AudioProcessor"},
    )

    results = []
    for case in cases:
        prompt = tok.apply_chat_template(case["messages"], tokenize=False, add_generation_prompt=True)
        audio = [read_wav(AUDIO_DIR / media_table[r]["file"]) for r in case["media"]]
        inputs = processor(text=[prompt], audio=audio, sampling_rate=16000, return_tensors="pt")
        ids = inputs["input_ids"][0].tolist()
        mask = inputs["feature_attention_mask"]
        placeholders = []
        i, refs = 0, iter(case["media"])
        while i < len(ids):
            if ids[i] == audio_token:
                j = i
                while j < len(ids) and ids[j] == audio_token:
                    j += 1
                placeholders.append({"media": next(refs), "kind": "audio", "start": i, "tokens": j - i})
                i = j
            else:
                i += 1
        features = inputs["input_features"]
        per_clip = []
        for k, ref in enumerate(case["media"]):
            frames = int(mask[k].sum())
            per_clip.append({
                "media": ref,
                "feature_attention_mask_sum": frames,
                "audio_tokens": placeholders[k]["tokens"],
                "input_features": stats(features[k]),
                "input_features_valid_frames": stats(features[k, :, :frames]),
                "first16_frame0": f32(features[k, :16, 0].numpy()),
            })
        forward = {k: v for k, v in inputs.items() if k != "attention_mask"}
        with torch.no_grad():
            out = model(**forward)
            out64 = model64(**{k: (v.double() if v.is_floating_point() else v) for k, v in forward.items()})
            lengths = mask.sum(-1)
            _, out_lengths = model.model.audio_tower._get_feat_extract_output_lengths(lengths)
            embeds = audio_embeddings(model, features, lengths)
        last = out.logits[0, -1]
        record = {
            "name": case["name"],
            "about": case["about"],
            "messages": case["messages"],
            "media": case["media"],
            "chat_template_kwargs": {"add_generation_prompt": True},
            "processor_kwargs": {"sampling_rate": 16000},
            "prompt": prompt,
            "num_tokens": len(ids),
            "input_ids": ids,
            "placeholders": placeholders,
            "audio": per_clip,
            "audio_output_lengths": [int(x) for x in out_lengths],
            "audio_embeds": stats(embeds),
        }
        record.update(logits_summary(last))
        record["logits_last_f64_max_abs_diff"] = float((out64.logits[0, -1] - last.double()).abs().max())
        with torch.no_grad():
            record["greedy"] = greedy(model, dict(forward, attention_mask=inputs["attention_mask"]))
        results.append(record)

    check_reload_audio(results, media_table)
    reference = {
        "generated_by": "scripts/make_tiny_mm_models.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "model": "tiny-qwen2-audio (random weights)",
        "special_token_ids": {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS},
        "media": media_table,
        "cases": results,
    }
    (AUDIO_DIR / "reference.json").write_text(to_json(reference))


def audio_embeddings(model, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The projected audio features that replace the <|AUDIO|> tokens, all clips concatenated
    (the same steps as Qwen2AudioModel.forward, which does not expose them)."""
    from transformers.masking_utils import create_bidirectional_mask

    tower = model.model.audio_tower
    conv_lengths, out_lengths = tower._get_feat_extract_output_lengths(lengths)
    n = (features.shape[-1] - 2) // 2 + 1
    keep = (torch.arange(n)[None, :] < conv_lengths[:, None]).long()
    mask = create_bidirectional_mask(config=tower.config, inputs_embeds=torch.zeros(features.shape[0], n, 1),
                                     attention_mask=keep)
    hidden = tower(features, attention_mask=mask).last_hidden_state
    projected = model.model.multi_modal_projector(hidden)
    return torch.cat([projected[k, : int(out_lengths[k])] for k in range(features.shape[0])], dim=0)


def audio_hub_config(v5: dict) -> dict:
    """Qwen2-Audio's config.json as the hub lays it out (nested, rope_theta a plain field)."""
    text = {k: v for k, v in v5["text_config"].items()}
    rope = text.pop("rope_parameters", None) or {}
    text["rope_theta"] = rope.get("rope_theta", AUDIO_TEXT["rope_theta"])
    text.pop("dtype", None)
    audio = {k: v for k, v in v5["audio_config"].items()}
    audio.pop("dtype", None)
    return {
        "architectures": ["Qwen2AudioForConditionalGeneration"],
        "audio_config": dict(sorted(audio.items())),
        "audio_token_index": v5["audio_token_index"] if "audio_token_index" in v5 else v5["audio_token_id"],
        "model_type": "qwen2_audio",
        "text_config": dict(sorted(text.items())),
        "torch_dtype": "float32",
        "transformers_version": transformers.__version__,
    }


def check_reload_audio(results, media_table) -> None:
    from transformers import AutoProcessor

    model = Qwen2AudioForConditionalGeneration.from_pretrained(AUDIO_DIR, dtype=torch.float32).eval()
    proc = AutoProcessor.from_pretrained(AUDIO_DIR)
    loaded = WhisperFeatureExtractor.from_dict(json.loads((AUDIO_DIR / "preprocessor_config.json").read_text()))
    assert loaded.to_dict() == proc.feature_extractor.to_dict()
    for record in results:
        prompt = proc.apply_chat_template(record["messages"], tokenize=False, add_generation_prompt=True)
        assert prompt == record["prompt"], record["name"]
        audio = [read_wav(AUDIO_DIR / media_table[r]["file"]) for r in record["media"]]
        inputs = proc(text=[prompt], audio=audio, sampling_rate=16000, return_tensors="pt")
        assert inputs["input_ids"][0].tolist() == record["input_ids"], record["name"]
        with torch.no_grad():
            out = model(**{k: v for k, v in inputs.items() if k != "attention_mask"})
        assert f32(out.logits[0, -1].numpy()) == record["logits_last"], record["name"]


# --------------------------------------------------------------------------------------------


def write_json(path: Path, value: dict) -> None:
    def plain(v):
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    path.write_text(json.dumps(plain(value), indent=2, sort_keys=True) + "\n")


def finish_tokenizer_files(folder: Path) -> None:
    """tokenizer_config.json names Qwen2Tokenizer (as the hub's Qwen checkpoints do; it loads this
    tokenizer.json unchanged) and also carries the chat template (older readers look there; the
    chat_template.jinja save_pretrained writes holds the same text)."""
    path = folder / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    write_json(path, cfg)
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        assert jinja.read_text() == CHAT_TEMPLATE


def check_template_with_jinja2(tok) -> None:
    """The template renders the same in plain jinja2 (closer to minijinja than HF's sandbox
    with its extensions) as through the tokenizer."""
    import jinja2

    env = jinja2.Environment(undefined=jinja2.Undefined)
    template = env.from_string(CHAT_TEMPLATE)
    messages = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "a.png"}}, {"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": [{"video": "v.mp4"}, {"audio": "a.wav"}, {"text": "And these?"}]},
    ]
    for gen in (False, True):
        direct = template.render(messages=messages, add_generation_prompt=gen)
        via = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        assert direct == via, (direct, via)
    expected = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>"
        "Audio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\nAnd these?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert template.render(messages=messages, add_generation_prompt=True) == expected


def main() -> None:
    if transformers.__version__ != EXPECTED_TRANSFORMERS:
        raise SystemExit(f"transformers {EXPECTED_TRANSFORMERS} is required, found {transformers.__version__}")
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    # Per-call min_pixels / max_pixels (what vLLM's mm_processor_kwargs pass) still work in 5.24.
    warnings.filterwarnings("ignore", message="Passing `min_pixels` and `max_pixels`", category=FutureWarning)
    torch.use_deterministic_algorithms(True)
    for folder in (VL_DIR, AUDIO_DIR):
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)

    tok = build_tokenizer()
    check_template_with_jinja2(tok)
    run_vl(tok)
    run_audio(tok)

    digest = hashlib.sha256()
    for folder in (VL_DIR, AUDIO_DIR):
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        for path in files:
            digest.update(f"{path.relative_to(DATA)}\0{sha256(path)}\n".encode())
        print(f"{folder.relative_to(ROOT)}: {len(files)} files, {sum(p.stat().st_size for p in files)} bytes")
    print("sha256 over all written files:", digest.hexdigest())


if __name__ == "__main__":
    main()
