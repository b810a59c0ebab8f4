"""The easysteer target's seat: ``spec.json`` and its ``.gguf`` vectors for EasySteer's v2 API
(``--target easysteer``)."""

from __future__ import annotations

from steerc.targets.features import ALL_KEYS, Capabilities, Feature, no, supported, table, yes
from steerc.targets.seat import Target, only

_ELSEWHERE = "or use the hf or vllm target"


def _capabilities() -> Capabilities:
    """What an EasySteer ``direct`` spec can say: adds at decoder-layer outputs, with ``normalize``, on the
    prompt and generation positions and windows its ``apply`` clause selects."""
    def refuse(key: str, note: str, instead: str = "") -> Feature:
        return no(key, note, f"{instead}, {_ELSEWHERE}" if instead else "use the hf or vllm target")

    base = {
        **{k: refuse(k, "steerc writes EasySteer's `direct` algorithm: it adds a vector, nothing else",
                     "steer with `add`") for k in ALL_KEYS if k.startswith("op:")},
        **{k: refuse(k, "EasySteer's `direct` adds to decoder-layer outputs only (hidden + residual)",
                     "steer resid_post[l]") for k in ALL_KEYS if k.startswith("site:")},
        **{k: refuse(k, "EasySteer's `apply` selects prompt and generation positions and windows",
                     "write tokens prompt[i], prompt[a:b], generated[j] or generated[a:b]")
           for k in ALL_KEYS if k.startswith("scope:")},
        **{k: refuse(k, "EasySteer's `direct` adds unconditionally: it reads no probe", "drop the `when` line")
           for k in ALL_KEYS if k.startswith(("gate:", "readout:"))},
        **{k: refuse(k, "an EasySteer spec carries no output constraint", "constrain the output yourself")
           for k in ALL_KEYS if k.startswith("constraint:")},
        **supported("EasySteer casts each direction to the model's dtype and adds it in that dtype",
                    dtype="float32 float16 bfloat16"),
    }
    return table(
        "easysteer",
        "an EasySteer SteeringSpec (its v2 API, spec.json) and the GGUF vectors its `direct` algorithm reads",
        base,
        add=yes("op:add", "a `direct` vector of scale 1 (several at one layer: `conflict: sequential`, in order)"),
        preserve_norm=yes("op:preserve-norm", "`normalize: true` (every steered row back to its input norm)"),
        schedule=refuse("op:schedule", "EasySteer's `scale` is one number", "write generated[a:b] windows"),
        resid_post=yes("site:resid_post", "`direction.l` of the vector's GGUF, `layers` [l]: the output of decoder "
                                          "layer l (l >= 1)"),
        all=yes("scope:all", "`prompt: \"all\"` and `generation: \"all\"`"),
        prompt=yes("scope:prompt", "`prompt: \"all\"`"),
        generated=yes("scope:generated", "`generation: \"all\"`"),
        prompt_slice=yes("scope:prompt-slice", "`prompt_positions` [i] or `prompt_window` [a, b] (one a vector)"),
        generated_slice=yes("scope:generated-slice", "`generation_positions` [j] or `generation_window` [a, b] "
                                                     "(j, a >= 0; one window a vector)"),
        union=yes("scope:union", "the selectors of one `apply` clause, which EasySteer unites"),
        per_request=refuse("param:per-request", "an EasySteer spec's scale is a number fixed when it is written",
                           "drop `per request`"),
    )


def emit(plan, facts, out_dir: str, *, command: str = "", key: bytes | None = None) -> list[str]:
    from steerc.targets.easysteer.emit import emit as write_spec

    return write_spec(plan, facts, out_dir, command)


def check(result) -> None:
    from steerc.targets.easysteer.lower import check_easysteer

    check_easysteer(result)


CAPABILITIES = _capabilities()
TARGET = Target("easysteer", "spec.json and its .gguf vectors for EasySteer's v2 API (its `direct` algorithm)",
                CAPABILITIES, emit, check=check, kernels=only("affine"))  # lower.ADDS
