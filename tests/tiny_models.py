"""Seeded random-weight tiny models of each family, built from the shared configs."""

from __future__ import annotations

import functools
import os

from steerc.facts.families import FAMILIES as FAMILIES_INFO

os.environ.setdefault("HF_HUB_OFFLINE", "1")

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "examples")

# Families whose tiny config ships with the shared examples; the others are built here.
SHARED = {"llama": "tiny-llama", "qwen2": "tiny-qwen2", "gemma2": "tiny-gemma2", "gpt2": "tiny-gpt2"}

# The same shape as the shared ones (4 layers, hidden 64, 4 heads of 16, 2 kv heads, vocab 512); MoE
# families get 4 experts, top-2. Each adds what makes its layout its own (multipliers, shared experts,
# a dense layer among sparse ones, sliding windows and attention sinks).
BASE = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
             vocab_size=512, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
BUILT = {
    "gpt_neox": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128,
                     vocab_size=512, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                     use_parallel_residual=True, rotary_pct=0.25, hidden_dropout=0.0, attention_dropout=0.0),
    "olmo2": BASE,
    "granite": dict(BASE, residual_multiplier=0.5, embedding_multiplier=3.0, attention_multiplier=0.25,
                    logits_scaling=2.0),
    "cohere": dict(BASE, logit_scale=0.5),
    "mixtral": dict(BASE, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "qwen2_moe": dict(BASE, **_EXPERTS, shared_expert_intermediate_size=48, norm_topk_prob=False),
    "qwen3_moe": dict(BASE, **_EXPERTS, head_dim=16, norm_topk_prob=True, mlp_only_layers=[1]),
    "olmoe": dict(BASE, num_experts=4, num_experts_per_tok=2),
    "gpt_oss": dict(BASE, num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=4,
                    layer_types=["sliding_attention", "full_attention"] * 2,
                    # vLLM's gpt-oss reads YaRN parameters; factor 2 = 256 / 128 keeps transformers quiet.
                    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 2.0,
                                     "original_max_position_embeddings": 128, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "truncate": False}),
}
FAMILIES = ("llama", "qwen2", "gemma2", "gpt2", *BUILT)

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
    return AutoConfig.for_model(family, **BUILT[family])


def from_config(cfg, dtype):
    """A random model of ``cfg``; MoE experts run as transformers' eager loop (its grouped_mm has no float64)."""
    from transformers import AutoModelForCausalLM

    from steerc.facts import facts_from_config

    moe = FAMILIES_INFO[facts_from_config(cfg.to_dict()).family].experts_key is not None
    return AutoModelForCausalLM.from_config(cfg, dtype=dtype, **({"experts_implementation": "eager"} if moe else {}))


def _one_thread() -> None:
    import torch

    # Tiny matrices: thread start-up costs ten times the work.
    torch.set_num_threads(1)


@functools.lru_cache(maxsize=None)
def tiny_model(family: str, dtype: str | None = None, seed: int = 0):
    import torch

    _one_thread()
    torch.manual_seed(seed)
    dtype = dtype or exact_dtype(family)
    model = from_config(config(family), getattr(torch, dtype))
    # Random init is small; widen it so steering visibly changes greedy tokens.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    return model.eval()


def save_tiny_llama(path) -> str:
    """The tiny float32 Llama with a real (small, in-memory-trained) byte-BPE tokenizer, saved as a model
    folder at ``path`` (what the commands load as ``--model FOLDER``)."""
    from tokenizer_util import byte_bpe

    tiny_model("llama", "float32").save_pretrained(path)
    byte_bpe(512).save_pretrained(path)
    return str(path)


class CharTokenizer:
    """A tokenizer stand-in for `after "..."` scopes: token i decodes to one character."""

    alphabet = "abcdefghijklmnopqrstuvwxyz:ABCDEFGHIJKLMNOPQRSTUVWXYZ .,!?0123456789"

    def decode(self, ids, **_):
        return "".join(self.alphabet[i % len(self.alphabet)] for i in ids)

    def encode(self, text):
        return [self.alphabet.index(c) for c in text]
