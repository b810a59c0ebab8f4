"""Seeded random-weight tiny models of each family, built from the shared configs."""

from __future__ import annotations

import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

EXAMPLES = os.environ.get(
    "STEERC_EXAMPLES", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "examples")
)

# Families whose tiny config ships with the shared examples; gpt_neox is built here.
SHARED = {"llama": "tiny-llama", "qwen2": "tiny-qwen2", "gemma2": "tiny-gemma2", "gpt2": "tiny-gpt2"}
FAMILIES = ("llama", "qwen2", "gemma2", "gpt2", "gpt_neox")

# transformers' eager Gemma-2 attention turns left padding into NaN in float64
# (fully masked rows, then 0 * NaN in the value product); float32 is clean.
EXACT_DTYPE = {"gemma2": "float32"}


def exact_dtype(family: str) -> str:
    return EXACT_DTYPE.get(family, "float64")


def tolerance(family: str) -> float:
    return 1e-5 if exact_dtype(family) == "float32" else 1e-10


def config(family: str):
    from transformers import AutoConfig

    if family in SHARED:
        return AutoConfig.from_pretrained(os.path.join(EXAMPLES, "models", SHARED[family]))
    return AutoConfig.for_model(
        "gpt_neox", hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128,
        vocab_size=512, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        use_parallel_residual=True, rotary_pct=0.25, hidden_dropout=0.0, attention_dropout=0.0,
    )


def _one_thread() -> None:
    import torch

    # Tiny matrices: thread start-up costs ten times the work.
    torch.set_num_threads(1)


@functools.lru_cache(maxsize=None)
def tiny_model(family: str, dtype: str | None = None, seed: int = 0):
    import torch
    from transformers import AutoModelForCausalLM

    _one_thread()
    torch.manual_seed(seed)
    dtype = dtype or exact_dtype(family)
    cfg = config(family)
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    # Random init is small; widen it so steering visibly changes greedy tokens.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    return model.eval()


class CharTokenizer:
    """A tokenizer stand-in for `after "..."` scopes: token i decodes to one character."""

    alphabet = "abcdefghijklmnopqrstuvwxyz:ABCDEFGHIJKLMNOPQRSTUVWXYZ .,!?0123456789"

    def decode(self, ids, **_):
        return "".join(self.alphabet[i % len(self.alphabet)] for i in ids)

    def encode(self, text):
        return [self.alphabet.index(c) for c in text]
