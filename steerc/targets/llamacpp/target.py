"""The llamacpp target's seat: ``control_vector.gguf`` for llama.cpp's ``--control-vector``
(``--target llamacpp``)."""

from __future__ import annotations

from steerc.targets.features import ALL_KEYS, Capabilities, Feature, no, supported, table, yes
from steerc.targets.seat import Target, only

_LLAMACPP_ELSEWHERE = "or use the hf or vllm target"


def _capabilities() -> Capabilities:
    """llama.cpp's control vectors (``--target llamacpp``): one vector per layer, added to its output."""
    def refuse(key: str, note: str, instead: str = "") -> Feature:
        return no(key, note, f"{instead}, {_LLAMACPP_ELSEWHERE}" if instead else "use the hf or vllm target")

    ops = "a llama.cpp control vector is one vector per layer, added to the layer's output"
    everywhere = "llama.cpp adds its control vector at every position it computes, prompt and generated alike"
    unconditional = "llama.cpp adds its control vector unconditionally: it reads no probe"
    base = {
        **{k: refuse(k, ops, "steer with `add`") for k in ALL_KEYS if k.startswith("op:")},
        **{k: refuse(k, "llama.cpp adds control vectors to decoder-layer outputs only (`build_cvec`, after the "
                    "layer's last residual add)", "steer resid_post[l] instead")
           for k in ALL_KEYS if k.startswith("site:")},
        **{k: refuse(k, everywhere, "drop the `tokens` line (`tokens all`)") for k in ALL_KEYS if k.startswith("scope:")},
        **{k: refuse(k, unconditional, "drop the `when` line") for k in ALL_KEYS if k.startswith(("gate:", "readout:"))},
        **{k: refuse(k, "a control vector carries no output constraint",
                 "constrain llama.cpp's sampling yourself (its --grammar or --json-schema)")
           for k in ALL_KEYS if k.startswith("constraint:")},
        **supported("llama.cpp adds the F32 vector to its float32 activations, whatever the weights' type",
                    dtype="float32 float16 bfloat16 float64"),
        **supported("llama.cpp's own: each layer's direction lives where the layer does (`select_buft`)",
                    parallel="tensor pipeline"),
    }
    return table(
        "llamacpp",
        "a control-vector GGUF for llama.cpp's --control-vector (one vector per layer, added to its output)",
        base,
        add=yes("op:add", "`direction.l` of the GGUF; several adds at one layer are summed, as llama.cpp sums "
                           "several control vectors"),
        schedule=refuse("op:schedule", "llama.cpp adds the same vector at every step", "drop the schedule"),
        loreft=refuse("op:loreft", "a control vector adds one fixed vector; a LoReFT's edit depends on the hidden "
                                   "state (h + R^T (W h + b - R h))"),
        clamp_feature=refuse("op:clamp-feature", "a control vector adds one fixed vector; an SAE clamp adds "
                                                 "(c - f_i(h)) W_dec[i], which depends on the hidden state"),
        preserve_norm=refuse("op:preserve-norm", "llama.cpp adds the vector without rescaling", "drop `preserve norm`"),
        resid_pre=yes("site:resid_pre", "resid_pre[l] for l >= 2, as `direction.(l-1)`; resid_pre[0] (the "
                                         "embeddings) and resid_pre[1] (layer 0's output) are out of reach"),
        resid_post=yes("site:resid_post", "resid_post[l] for l >= 1, as `direction.l`; llama.cpp never steers "
                                           "layer 0's output (its loader refuses `direction.0`)"),
        all=yes("scope:all", everywhere),
        per_request=refuse("param:per-request", "a control vector holds fixed values (llama.cpp scales a whole file "
                                            "with --control-vector-scaled)", "compile one file per value with --set"),
    )


def emit(plan, facts, out_dir: str, *, command: str = "", key: bytes | None = None) -> list[str]:
    from steerc.targets.llamacpp.emit import emit as write_vector

    return write_vector(plan, facts, out_dir, command)


def check(result) -> None:
    from steerc.targets.llamacpp.lower import check_llamacpp

    check_llamacpp(result)


CAPABILITIES = _capabilities()
TARGET = Target("llamacpp", "control_vector.gguf for llama.cpp's --control-vector", CAPABILITIES, emit,
                check=check, kernels=only("affine"))
