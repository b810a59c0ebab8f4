"""The weights target's seat: the program folded into a Hugging Face checkpoint that any engine serves with no
plugin (``--target weights``)."""

from __future__ import annotations

from steerc.targets.features import ALL_KEYS, Capabilities, Feature, no, supported, table, yes
from steerc.targets.seat import Target, only

_HOOKS = "use the hf or vllm target, which steer with hooks"
_EVERY_TOKEN = "folded weights act on every token of every request alike"


def _capabilities() -> Capabilities:
    """What folds exactly into weights: fixed affine maps of a site one matrix writes, on every token."""
    def refuse(key: str, note: str, instead: str = "") -> Feature:
        return no(key, note, f"{instead}, or {_HOOKS}" if instead else _HOOKS)

    base = {
        **{k: refuse(k, f"{_EVERY_TOKEN}: a scope needs to know which token it is",
                     "drop the `tokens` line (`tokens all`)") for k in ALL_KEYS if k.startswith("scope:")},
        **{k: refuse(k, f"{_EVERY_TOKEN}: a gate reads a probe, which a matrix cannot", "drop the `when` line")
           for k in ALL_KEYS if k.startswith(("gate:", "readout:"))},
        **{k: refuse(k, "a checkpoint carries no output constraint",
                     "constrain the serving engine's sampling (vLLM's guided decoding, llama.cpp's --grammar)")
           for k in ALL_KEYS if k.startswith("constraint:")},
        **supported("folded in float64, written in the checkpoint's own dtype", dtype="float32 float16 bfloat16 "
                                                                                      "float64"),
        **supported("the serving engine's own: the checkpoint is an ordinary one", parallel="tensor pipeline"),
        **supported("L y + c folded into the matrix that writes the site (spec/targets.md, `weights`)",
                    op="scale scale-vector suppress ablate rotate"),
    }
    bias = ("its constant part folds into the bias of the matrix that writes the site (Llama's attention_bias / "
            "mlp_bias, the other projections' biases written as zeros), or into every embedding row; a family "
            "without a bias there is refused")
    return table(
        "weights",
        "a Hugging Face checkpoint with the program folded into its weights, for any engine, with no plugin",
        base,
        add=yes("op:add", bias),
        set=yes("op:set", bias),
        clamp=yes("op:clamp", bias),
        rotate=yes("op:rotate", "`rotate ... by` is linear and folds; `rotate ... to` depends on where h points "
                                "and is refused"),
        schedule=refuse("op:schedule", f"{_EVERY_TOKEN}: a schedule changes with the generation step",
                        "drop the schedule"),
        preserve_norm=refuse("op:preserve-norm", "rescaling to the input's norm is not linear", "drop "
                                                                                                "`preserve norm`"),
        loreft=refuse("op:loreft", "a LoReFT's edit is affine but in the low-rank subspace of one site; folding "
                                   "it is not implemented"),
        clamp_feature=refuse("op:clamp-feature", "an SAE clamp depends on the feature's activation, a nonlinear "
                                                 "function of h"),
        attn_out=yes("site:attn_out", "the attention output projection (o_proj): W' = L W, b' = f(b)"),
        mlp_out=yes("site:mlp_out", "the MLP down projection (down_proj): W' = L W, b' = f(b)"),
        head=yes("site:head", "the head's columns of o_proj: W[:, h]' = W[:, h] L, b' = b + W[:, h] c"),
        resid_pre=yes("site:resid_pre", "resid_pre[0] only: every embedding row e becomes f(e) (a tied lm_head "
                                         "is untied); resid_pre[l >= 1] is resid_post[l-1]"),
        resid_post=refuse("site:resid_post", "the stream after a layer is the sum of everything written to it, "
                                             "which no one matrix writes",
                          "steer attn_out or mlp_out; to ablate a direction from the stream, ablate it at "
                          "resid_pre[0], attn_out[*] and mlp_out[*]"),
        all=yes("scope:all", _EVERY_TOKEN),
        per_request=refuse("param:per-request", "the values are folded into the weights",
                           "compile one checkpoint per value with --set"),
    )


def emit(plan, facts, out_dir: str, *, command: str = "", key: bytes | None = None, model=None) -> list[str]:
    from steerc.targets.weights.emit import emit as write_folder

    return write_folder(plan, facts, out_dir, command, model)


def check(result) -> None:
    from steerc.targets.weights.layout import check_weights

    check_weights(result)


CAPABILITIES = _capabilities()
TARGET = Target("weights", "a Hugging Face checkpoint with the program folded into its weights (any engine, no "
                           "plugin)", CAPABILITIES, emit, check=check, needs_model=True,
                kernels=only("affine", "project", "rotate"))
