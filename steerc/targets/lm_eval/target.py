"""The lm-eval target's seat: ``steer.csv`` for lm-eval-harness's ``steered`` model (``--target lm-eval``)."""

from __future__ import annotations

from steerc.targets.features import ALL_KEYS, Capabilities, Feature, no, supported, table, yes
from steerc.targets.seat import Target, only

_ELSEWHERE = "or use the hf or vllm target"
# lm-eval's clamp, as steerc writes it (spec/formats.md); `clamp feature` is another operation.
LM_EVAL_CLAMP = "clamp s[i] to c + dot(b_dec, û)"


def _capabilities() -> Capabilities:
    """What lm-eval 0.4.13's CSV can say: the projection clamp of an SAE feature around b_dec, on a module's whole
    output, at every position."""
    def refuse(key: str, note: str, instead: str = "") -> Feature:
        return no(key, note, f"{instead}, {_ELSEWHERE}" if instead else "use the hf or vllm target")

    ops = "lm-eval's CSV rows add or clamp an SAE feature, nothing else"
    base = {
        **{k: refuse(k, ops, f"write `{LM_EVAL_CLAMP}`") for k in ALL_KEYS if k.startswith("op:")},
        **{k: refuse(k, "lm-eval steers every position of a module's output", "drop the `tokens` line")
           for k in ALL_KEYS if k.startswith("scope:")},
        **{k: refuse(k, "lm-eval steers unconditionally: it reads no probe", "drop the `when` line")
           for k in ALL_KEYS if k.startswith(("gate:", "readout:"))},
        **{k: refuse(k, "lm-eval's steered model carries no output constraint", "constrain the output yourself")
           for k in ALL_KEYS if k.startswith("constraint:")},
        **supported("lm-eval's hooks compute in the activations' dtype", dtype="float32 float16 bfloat16 float64"),
    }
    return table(
        "lm-eval",
        "lm-eval-harness's `steered` model: its CSV steering config (steer.csv), one sae_lens clamp row a hookpoint",
        base,
        clamp=yes("op:clamp", f"of an SAE feature only: `{LM_EVAL_CLAMP}` is the row `clamp` with coefficient c "
                              "(lm-eval clamps the component of h - b_dec along the unit decoder row)"),
        add=refuse("op:add", "lm-eval 0.4.13 asserts on a CSV add row (it gives every row b_dec as a bias, and "
                             "its add takes none)", f"write `{LM_EVAL_CLAMP}`"),
        clamp_feature=refuse("op:clamp-feature", "steerc's `clamp feature s[i] to c` sets the SAE's activation "
                                                 "f_i(h) to c; lm-eval's clamp sets the projection of h - b_dec "
                                                 f"on the decoder row: `{LM_EVAL_CLAMP}`",
                             f"write `{LM_EVAL_CLAMP}`"),
        schedule=refuse("op:schedule", "lm-eval's coefficient is fixed", "drop the schedule"),
        resid_pre=yes("site:resid_pre", "resid_pre[0] is embed_tokens where the family's layer 0 reads it unscaled "
                                        "(the compiler rewrites resid_pre[l] to resid_post[l-1])"),
        resid_post=yes("site:resid_post", "hookpoint layers.L: the output of decoder layer L"),
        attn_out=yes("site:attn_out", "hookpoint layers.L.self_attn, where the family's attn_out is that output"),
        mlp_out=yes("site:mlp_out", "hookpoint layers.L.mlp, where the family's mlp_out is that output"),
        head=refuse("site:head", "lm-eval's CSV path does not read head_index: it steers a module's whole output",
                    "steer resid_post, attn_out or mlp_out"),
        all=yes("scope:all", "lm-eval steers every position"),
        per_request=refuse("param:per-request", "the CSV's coefficient is a fixed number", "use a plain param"),
    )


def emit(plan, facts, out_dir: str, *, command: str = "", key: bytes | None = None, result=None) -> list[str]:
    from steerc.targets.lm_eval.emit import emit as write_csv

    return write_csv(plan, facts, out_dir, command, result=result)


def check(result) -> None:
    from steerc.targets.lm_eval.lower import check_lm_eval

    check_lm_eval(result)


CAPABILITIES = _capabilities()
TARGET = Target("lm-eval", "steer.csv for lm-eval's `steered` model (sae_lens clamp rows)", CAPABILITIES, emit,
                check=check, kernels=only("project"), reads_program=True)  # lower.CLAMPS
