"""The export target's seat: a ``torch.export``'ed steered model with a static KV cache (``--target export``)."""

from __future__ import annotations

from steerc.targets.features import ALL_KEYS, no, supported, table, yes
from steerc.targets.hf.target import HOOK_KERNELS
from steerc.targets.seat import Target, with_maths

_HF = "use the hf target (its in-process runtime or emitted package) for this"


def emit(plan, facts, out_dir: str, *, command: str = "", key: bytes | None = None, model=None) -> list[str]:
    from steerc.targets.export.build import build

    return build(plan, facts, out_dir, command, model)


CAPABILITIES = table(
    "export",
    "a torch.export'ed steered model: input ids, positions and the prompt's length in, logits out",
    supported(
        "traced into the exported graph (the hf target's kernels)",
        **HOOK_KERNELS,
        gate="token",
        dtype="float32 bfloat16 float64",
    ),
    **{k.replace(":", "_").replace(".", "_"): yes(
        k, "its value is a buffer of the exported program, decided by the call that holds the prompt's last "
           "position (prefill the prompt in one call) and read by the decode steps after it")
       for k in ("gate:prompt.mean", "gate:prompt.last")},
    after=no("scope:after", "where a text ends is found by decoding tokens, which an exported graph cannot do",
             "steer `prompt[...]` or `generated[...]` positions, or " + _HF),
    **{k.split(":")[1]: no(k, "the exported program computes logits; a constraint belongs to the sampler",
                           "constrain the sampling that reads its logits, or " + _HF)
       for k in ALL_KEYS if k.startswith("constraint:")},
    tensor=no("parallel:tensor", "exported for one device", "use the vllm target for tensor parallelism"),
    pipeline=no("parallel:pipeline", "exported for one device", "use the vllm target for pipeline parallelism"),
    per_request=no("param:per-request", "the values are buffers fixed when it is exported (swap them with "
                                         "the program's state_dict)", "compile with --set NAME=VALUE"),
    float16=yes("dtype:float16", "steered in float32, cast back, as on the hf target"),
)

TARGET = Target("export", "a torch.export'ed steered model (program.pt2, AOTInductor model.aoti.pt2)",
                CAPABILITIES, emit, backend="hf", needs_model=True, kernels=with_maths)
