#!/usr/bin/env python3
"""Reference fixtures for the kernels' quantised types, made with the `gguf` package's own
(numpy) dequantisers, an implementation independent of ours.

For each type: ROWS x COLS weights as blocks (`<TYPE>.bin`, the raw GGUF bytes) and the floats
`gguf.quants.dequantize` makes of them (`<TYPE>.f32`, little-endian). The first half of the rows
are `gguf.quants.quantize` of normal random floats where the package quantises that type; the
rest (all rows otherwise) are random bytes with random finite f16 scales, so that every bit
pattern of the quants and packed sub-scales occurs. Fixed seeds: the output is the same on
every run.

Run with the interpreter scripts/fetch-gguf-py.sh prints:
    "$(scripts/fetch-gguf-py.sh)" scripts/make_quant_fixtures.py [OUT_DIR]
"""

import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

ROWS = 4
COLS = 512

# Type name -> byte offsets of its f16 scale fields within a block.
SCALE_FIELDS = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "IQ4_NL": [0],
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
    "IQ4_XS": [0],
}

# Types the package can quantise (the rest it only dequantises).
QUANTISABLE = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}


def random_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite f16 values of both signs, magnitudes 2^-14 .. 2^-3 (a few subnormal)."""
    mag = np.exp2(rng.uniform(-16.0, -3.0, size=n))
    sign = np.where(rng.integers(0, 2, size=n) == 0, -1.0, 1.0)
    return (mag * sign).astype(np.float16)


def make(name: str, seed: int) -> tuple[bytes, bytes]:
    qtype = T[name]
    block, size = GGML_QUANT_SIZES[qtype]
    assert COLS % block == 0
    rng = np.random.default_rng(seed)
    blocks_per_row = COLS // block
    rows = []
    quantised_rows = ROWS // 2 if name in QUANTISABLE else 0
    for _ in range(quantised_rows):
        x = rng.normal(0.0, 0.05, size=(1, COLS)).astype(np.float32)
        rows.append(np.asarray(quants.quantize(x, qtype), dtype=np.uint8).reshape(-1))
    for _ in range(ROWS - quantised_rows):
        raw = rng.integers(0, 256, size=(blocks_per_row, size), dtype=np.uint8)
        for off in SCALE_FIELDS[name]:
            raw[:, off : off + 2] = random_f16(rng, blocks_per_row).view(np.uint8).reshape(-1, 2)
        rows.append(raw.reshape(-1))
    data = np.stack(rows).astype(np.uint8)
    assert data.shape == (ROWS, blocks_per_row * size)
    floats = quants.dequantize(data, qtype).astype("<f4")
    assert floats.shape == (ROWS, COLS) and np.isfinite(floats).all()
    return data.tobytes(), floats.tobytes()


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent.parent / "kernels/tests/data/quants"
    out.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(SCALE_FIELDS):
        blocks, floats = make(name, seed=1000 + i)
        (out / f"{name}.bin").write_bytes(blocks)
        (out / f"{name}.f32").write_bytes(floats)
        print(f"{name}: {len(blocks)} bytes of blocks, {len(floats) // 4} floats")


if __name__ == "__main__":
    main()
