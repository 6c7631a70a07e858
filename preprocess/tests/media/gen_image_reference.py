#!/usr/bin/env python3
"""Reference outputs for preprocess/tests/image_parity.rs, from Pillow and the Hugging Face image
processors (the PIL/numpy backend, `*ImageProcessorPil`, which is Pillow's arithmetic).

The input picture is computed from a formula (the Rust test computes the same one), so no image
file is committed. Needs numpy, pillow and transformers (5.x):
    python preprocess/tests/media/gen_image_reference.py > preprocess/tests/media/image_reference.json
"""
import base64
import json

import numpy as np
import transformers
from PIL import Image
from transformers import CLIPImageProcessorPil, Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize


def picture(w, h):
    """Gradients plus a checker; the same formula as `picture()` in image_parity.rs."""
    x = np.arange(w)[None, :].repeat(h, 0)
    y = np.arange(h)[:, None].repeat(w, 1)
    checker = np.where(((x // 4) + (y // 4)) % 2 == 0, 40, 0)
    r = (x * 255) // w
    g = (y * 255) // h
    b = ((x + y) * 3) % 200 + checker
    return np.stack([r, g, b], -1).astype(np.uint8)


def sample(flat, n=400):
    idx = np.linspace(0, flat.size - 1, n).astype(np.int64)
    return {"index": idx.tolist(), "value": [round(float(v), 6) for v in flat[idx]]}


def main():
    out = {"transformers": transformers.__version__, "pillow": Image.__version__, "cases": []}
    for (w, h) in [(160, 120), (37, 91)]:
        arr = picture(w, h)
        img = Image.fromarray(arr, "RGB")
        case = {"width": w, "height": h}
        # Pillow bicubic resizes, down and up.
        for (rw, rh) in [(56, 42), (100, 80)]:
            r = np.asarray(img.resize((rw, rh), Image.BICUBIC))
            case[f"pil_bicubic_{rw}x{rh}"] = base64.b64encode(r.tobytes()).decode()
        clip = CLIPImageProcessorPil(size={"height": 56, "width": 56}, do_center_crop=False)
        pv = clip(images=img, return_tensors="np")["pixel_values"][0]
        case["clip_56"] = {"shape": list(pv.shape), **sample(pv.ravel())}
        q = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 16)
        res = q(images=img, return_tensors="np")
        pv = res["pixel_values"]
        case["qwen2vl"] = {
            "min_pixels": 56 * 56,
            "max_pixels": 28 * 28 * 16,
            "grid_thw": [int(v) for v in res["image_grid_thw"][0]],
            "shape": list(pv.shape),
            **sample(pv.ravel()),
        }
        out["cases"].append(case)
    sizes = []
    for (h, w, lo, hi) in [(960, 1280, 3136, 1003520), (20, 20, 3136, 1003520), (100, 150, 3136, 1003520),
                           (4000, 30, 3136, 1003520), (123, 457, 3136, 12845056), (1080, 1920, 3136, 200704),
                           (29, 57, 100, 5000)]:
        rh, rw = smart_resize(h, w, factor=28, min_pixels=lo, max_pixels=hi)
        sizes.append({"height": h, "width": w, "min_pixels": lo, "max_pixels": hi, "resized": [rh, rw]})
    out["smart_resize"] = sizes
    print(json.dumps(out))


if __name__ == "__main__":
    main()
