"""How each supported architecture spells its layout in ``config.json``.

One row per family: the ``model_type`` values that select it, and how to
read each fact (the config keys to try in order, or a default). The values
were read from the transformers 5.24 configuration classes and checked
against the real configs in ``tests/fixtures/examples/models/real``.
"""

from __future__ import annotations

from steerc.core.record import frozen


@frozen
class Family:
    name: str
    model_types: tuple[str, ...]
    layers: tuple[str, ...] = ("num_hidden_layers",)
    hidden: tuple[str, ...] = ("hidden_size",)
    heads: tuple[str, ...] = ("num_attention_heads",)
    kv_heads: tuple[str, ...] = ("num_key_value_heads",)
    intermediate: tuple[str, ...] = ("intermediate_size",)
    vocab: tuple[str, ...] = ("vocab_size",)
    tied_default: bool = False  # tie_word_embeddings when the config is silent
    head_dim_from_config: bool = True  # honour an explicit `head_dim`
    parallel_residual_key: str | None = None
    parallel_residual_default: bool = False  # the fact when the config is silent (or the family has no key)
    # How a block's output enters the residual stream (spec/models.md, "Block outputs"):
    post_norms: bool = False  # attn and MLP outputs are normed before the add (Gemma-2/3 sandwich, OLMo-2)
    residual_scale_key: str | None = None  # Granite: both outputs are multiplied by this config value in the add
    experts_key: str | None = None  # MoE: the config key counting routed experts; mlp_out is the sparse block
    # transformers' configuration-class defaults, for configs that leave a key out
    # (None: head_dim = hidden // heads, kv_heads = heads).
    head_dim_default: int | None = None
    kv_heads_default: int | None = None
    intermediate_default: int | None = None  # None: 4 x hidden


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("llama", ("llama",)),
        Family("mistral", ("mistral",), kv_heads_default=8),
        # Qwen2's attention always uses hidden // heads (vLLM qwen2.py:150, HF modeling_qwen2).
        Family("qwen2", ("qwen2",), head_dim_from_config=False, kv_heads_default=32),
        Family("qwen3", ("qwen3",), head_dim_default=128, kv_heads_default=32),
        Family("gemma", ("gemma",), tied_default=True, head_dim_default=256, kv_heads_default=16),
        Family("gemma2", ("gemma2",), tied_default=True, post_norms=True, head_dim_default=256,
               kv_heads_default=4),
        Family("gemma3_text", ("gemma3_text", "gemma3"), tied_default=True, post_norms=True,
               head_dim_default=256, kv_heads_default=4),
        Family("phi3", ("phi3",)),
        Family(
            "gpt2",
            ("gpt2",),
            layers=("n_layer", "num_hidden_layers"),
            hidden=("n_embd", "hidden_size"),
            heads=("n_head", "num_attention_heads"),
            kv_heads=(),
            intermediate=("n_inner",),
            tied_default=True,
            head_dim_from_config=False,
        ),
        Family(
            "gpt_neox",
            ("gpt_neox",),
            kv_heads=(),
            head_dim_from_config=False,
            parallel_residual_key="use_parallel_residual",
            parallel_residual_default=True,
        ),
        # Dense families of issue 15, read from transformers 5.24 (5.19 alike) and vLLM 0.32.
        Family("olmo2", ("olmo2",), post_norms=True),
        Family("granite", ("granite",), residual_scale_key="residual_multiplier"),
        # Cohere (Command-R, Aya): one input norm feeds attention and MLP, both add to the stream.
        Family("cohere", ("cohere",), tied_default=True, parallel_residual_default=True),
        # Mixture-of-experts families: `intermediate` is the width of one routed expert.
        Family("mixtral", ("mixtral",), kv_heads_default=8, experts_key="num_local_experts"),
        # vLLM's Qwen2-MoE and OLMoE attention always use hidden // heads (qwen2_moe.py:225, olmoe.py:147).
        Family("qwen2_moe", ("qwen2_moe",), intermediate=("moe_intermediate_size",), intermediate_default=1408,
               head_dim_from_config=False, kv_heads_default=16, experts_key="num_experts"),
        Family("qwen3_moe", ("qwen3_moe",), intermediate=("moe_intermediate_size",), intermediate_default=768,
               kv_heads_default=4, experts_key="num_experts"),
        Family("olmoe", ("olmoe",), head_dim_from_config=False, experts_key="num_experts"),
        Family("gpt_oss", ("gpt_oss",), head_dim_default=64, kv_heads_default=8, experts_key="num_local_experts"),
    )
}

MODEL_TYPES: dict[str, str] = {mt: f.name for f in FAMILIES.values() for mt in f.model_types}
