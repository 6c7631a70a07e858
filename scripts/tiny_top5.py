"""What the tiny-checkpoint scripts share: transformers' float32 top-5 logprobs at every
position of a prompt, and the `reference.json` that holds them."""

import json

import torch
import transformers


def top5(model, prompt):
    """`[[id, logprob], ...]` (5 pairs, logprobs rounded to 1e-6) for each position."""
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([prompt])).logits[0].double(), dim=-1)
    rows = []
    for pos in range(len(prompt)):
        v, i = torch.topk(lp[pos], 5)
        rows.append([[int(a), round(float(b), 6)] for a, b in zip(i, v)])
    return rows


def made_by(script, how):
    return (f"{script} (transformers {transformers.__version__}, "
            f"torch {torch.__version__.split('+')[0]}, {how})")


def write_reference(path, script, how, prompt, rows):
    with open(path, "w") as f:
        json.dump({"made_by": made_by(script, how), "prompt_ids": prompt, "top5": rows},
                  f, indent=1)
        f.write("\n")
