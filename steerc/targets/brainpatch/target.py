"""The brainpatch target's seat: ``<name>.brainpatch`` for BrainPatch 1.2 (``--target brainpatch``)."""

from __future__ import annotations

from steerc.targets.features import ALL_KEYS, Capabilities, Feature, no, supported, table, yes
from steerc.targets.seat import Target, only

_ELSEWHERE = "or use the hf or vllm target"


def _capabilities() -> Capabilities:
    """What a BrainPatch can say: adds at decoder-block outputs, on the prompt, the generated tokens or both, a
    step schedule, one live strength."""
    def refuse(key: str, note: str, instead: str = "") -> Feature:
        return no(key, note, f"{instead}, {_ELSEWHERE}" if instead else "use the hf or vllm target")

    ops = "a BrainPatch adds vectors to the residual stream, nothing else"
    base = {
        **{k: refuse(k, ops, "steer with `add`") for k in ALL_KEYS if k.startswith("op:")},
        **{k: refuse(k, "BrainPatch hooks decoder-block outputs only (its `residual_post`)", "steer resid_post[l]")
           for k in ALL_KEYS if k.startswith("site:")},
        **{k: refuse(k, "BrainPatch's sites are the prompt, the generated tokens, or both (with its schedule's "
                        "steps)", "write tokens prompt, generated, or generated[a:b]")
           for k in ALL_KEYS if k.startswith("scope:")},
        **{k: refuse(k, "BrainPatch adds unconditionally: it reads no probe", "drop the `when` line")
           for k in ALL_KEYS if k.startswith(("gate:", "readout:"))},
        **{k: refuse(k, "a BrainPatch carries no output constraint", "constrain the output yourself")
           for k in ALL_KEYS if k.startswith("constraint:")},
        **supported("BrainPatch's transformers backend casts the summed float32 vector to the activations' dtype",
                    dtype="float32 float16 bfloat16 float64"),
    }
    return table(
        "brainpatch",
        "a BrainPatch archive (.brainpatch, format 1.0), byte for byte as BrainPatch's save_patch writes it",
        base,
        add=yes("op:add", "an intervention of coefficient 1 (several at one layer: BrainPatch sums them in float32)"),
        schedule=refuse("op:schedule", "BrainPatch's schedule is one step function of its generation index for the "
                                       "whole patch", "write generated[a:b] segments, one intervention each"),
        resid_post=yes("site:resid_post", "`layer: l`, hook residual_post: the output of decoder block l"),
        all=yes("scope:all", "site all"),
        prompt=yes("scope:prompt", "site prompt (BrainPatch's prompt pass)"),
        generated=yes("scope:generated", "site continuation (every token fed back)"),
        generated_slice=yes("scope:generated-slice", "a step of the patch's schedule: generated[a:b] is its index "
                                                     "a to b-1 (index 0 also covers the prompt)"),
        union=yes("scope:union", "prompt, generated[0:b]: an all-site step that holds the prompt (index 0)"),
        per_request=yes("param:per-request", "one param multiplying every add: the live strength, its range [-m, m] "
                                             "max_abs_strength"),
    )


def emit(plan, facts, out_dir: str, *, command: str = "", key: bytes | None = None) -> list[str]:
    from steerc.targets.brainpatch.emit import emit as write_patch

    return write_patch(plan, facts, out_dir, command)


def check(result) -> None:
    from steerc.targets.brainpatch.lower import check_brainpatch

    check_brainpatch(result)


CAPABILITIES = _capabilities()
TARGET = Target("brainpatch", "<name>.brainpatch for BrainPatch 1.2 (its transformers backend's meaning)",
                CAPABILITIES, emit, check=check, kernels=only("affine"))  # lower.ADDS
