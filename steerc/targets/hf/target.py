"""The hf target's seat: a Python package of hooks for a transformers model (``--target hf``)."""

from __future__ import annotations

from steerc.targets.features import no, supported, table, yes
from steerc.targets.seat import Target, with_maths


def emit(plan, facts, out_dir: str, *, command: str = "", key: bytes | None = None) -> list[str]:
    from steerc.targets.hf.emit import emit as write_package  # safetensors: on use only
    from steerc.targets.hooks import lower_hf

    return write_package(lower_hf(plan, facts), out_dir, command)


# What the hooks compute, on every target that runs them (this one, and the export target's traced graph).
HOOK_KERNELS = {
    "op": "add scale scale-vector set suppress ablate clamp rotate loreft clamp-feature preserve-norm schedule",
    "site": "resid_pre resid_post attn_out mlp_out head",
    "scope": "all prompt generated prompt-slice generated-slice positions union",
    "readout": "cosine projected_cosine subspace_cosine dot norm sae_feature",
}

CAPABILITIES = table(
    "hf",
    "Python hooks on a transformers model: an emitted package or the in-process runtime",
    supported(
        **HOOK_KERNELS,
        gate="prompt.mean prompt.last token",
        constraint="regex grammar choice",
        dtype="float32 float16 bfloat16 float64",
    ),
    after=yes("scope:after", "needs the model's tokenizer at install time"),
    tensor=no("parallel:tensor", "runs in one process on one device map",
               "use the vllm target for tensor parallelism"),
    pipeline=yes("parallel:pipeline", "works with accelerate device maps (hooks move tensors)"),
    constraint=yes("constraint:json_schema", "an xgrammar logits processor in generate()"),
    per_request=yes("param:per-request", "values at install time: `install(model, plan, tokenizer, "
                                          "params={...})`, and the emitted package's `install(model, "
                                          "tokenizer, params={...})` (logits equal, every bound role)"),
)

TARGET = Target("hf", "a Python package of hooks", CAPABILITIES, emit, backend="hf", kernels=with_maths)
