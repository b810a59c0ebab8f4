"""The vllm-hook target's seat: IBM vLLM-Hook's declarative spec (``--target serve --dialect vllm-hook``)."""

from __future__ import annotations

from steerc.targets.features import ALL_KEYS, Feature, no, table, yes
from steerc.targets.seat import Target, only


def emit(plan, facts, out_dir: str, *, command: str = "", key: bytes | None = None) -> list[str]:
    from steerc.targets.vllm_hook.emit import emit_vllm_hook

    return emit_vllm_hook(plan, facts, out_dir)


def check(result) -> None:
    from steerc.targets.vllm_hook.lower import check_vllm_hook

    check_vllm_hook(result)


CAPABILITIES = table(
    "vllm-hook",
    "the declarative spec of IBM's vLLM-Hook plugin (--target serve --dialect vllm-hook)",
    {
        **{k: no(k, "vLLM-Hook has no such construct", "use the steerc serve format (--target serve)")
           for k in ALL_KEYS},
        **{k: Feature(k, True) for k in ("dtype:float32", "dtype:float16", "dtype:bfloat16", "dtype:float64")},
    },
    add=yes("op:add", "`additive` with strength 1.0 at resid_post; `head_additive` (the head's row set, "
                       "other rows zero) at head sites"),
    scale=no("op:scale", "vLLM-Hook's transforms add, project out or rotate; none multiplies the stream",
              "use the steerc serve format (--target serve)"),
    scale_vector=no("op:scale-vector", "vLLM-Hook's transforms add, project out or rotate; none "
                     "multiplies the stream", "use the steerc serve format (--target serve)"),
    set=no("op:set", "no vLLM-Hook transform replaces the stream",
            "use the steerc serve format (--target serve)"),
    suppress=no("op:suppress", "no vLLM-Hook transform zeroes the stream",
                 "use the steerc serve format (--target serve)"),
    ablate=yes("op:ablate", "one `projection` op per orthonormal direction (exact: the directions are "
                             "orthonormal)"),
    clamp=no("op:clamp", "vLLM-Hook's projection removes a component; it cannot pin it to a value",
              "use the steerc serve format (--target serve), which carries clamps"),
    rotate=yes("op:rotate", "`rotation`, mode `target` (`to`) or `offset` (`by`), basis [e1, e2]"),
    loreft=no("op:loreft", "vLLM-Hook's transforms add, project out or rotate with fixed vectors; none applies a "
                            "learned low-rank map of the hidden state", "use the steerc serve format (--target serve), "
                                                                        "which carries LoReFT"),
    clamp_feature=no("op:clamp-feature", "vLLM-Hook's transforms add, project out or rotate with fixed vectors; "
                                         "none encodes an SAE feature to set its activation",
                     "use the steerc serve format (--target serve), which carries SAE clamps"),
    preserve_norm=no("op:preserve-norm", "vLLM-Hook's norm_preserving modifier only scales back rows whose "
                      "norm grew; steerc rescales every selected row to its input norm",
                      "drop `preserve norm`, or use the steerc serve format (--target serve)"),
    resid_pre=yes("site:resid_pre", "resid_pre[l] for l >= 1 is layer l-1's output; resid_pre[0] (the "
                                     "embeddings) can be probed (condition layer 0) but not steered"),
    resid_post=yes("site:resid_post", "layer l's output (`layers: [l]`, 0-based); probed as condition "
                                       "layer l+1, so the last layer's output cannot be probed"),
    attn_out=no("site:attn_out", "vLLM-Hook hooks decoder-layer boundaries and o_proj's per-head input "
                 "only", "steer resid_post[l], or use the steerc serve format (--target serve)"),
    mlp_out=no("site:mlp_out", "vLLM-Hook hooks decoder-layer boundaries and o_proj's per-head input only",
                "steer resid_post[l], or use the steerc serve format (--target serve)"),
    head=yes("site:head", "`head_additive` at o_proj's input, `add` only; tensor parallel size 1"),
    all=yes("scope:all", "`all`"),
    prompt=no("scope:prompt", "vLLM-Hook's scopes are all, after_prompt, last_k and from_position; none "
               "selects the prompt alone", "use `prompt[-k:], generated`, `generated` or `all`, or the "
               "steerc serve format (--target serve)"),
    generated=yes("scope:generated", "`after_prompt`"),
    prompt_slice=yes("scope:prompt-slice", "only as `prompt[-k:], generated`, which is `last_k`"),
    generated_slice=no("scope:generated-slice", "no vLLM-Hook scope ends, or starts inside the generated "
                        "tokens", "use `generated`, or the steerc serve format (--target serve)"),
    positions=no("scope:positions", "vLLM-Hook's `from_position` selects every position from p on, not a "
                  "list", "use the steerc serve format (--target serve)"),
    after=no("scope:after", "vLLM-Hook has no scope that searches the prompt text",
              "use prompt[a:b] or positions the client computes for its prompt"),
    union=yes("scope:union", "only `prompt[-k:], generated`, which is `last_k`"),
    mean=yes("gate:prompt.mean", "`pooling: mean`, one `>=` / `<=` comparison (per_key_threshold); "
                                  "vLLM-Hook pools the positions it computes, so run without prefix caching"),
    last=yes("gate:prompt.last", "`pooling: last`, one `>=` / `<=` comparison (per_key_threshold)"),
    token=no("gate:token", "vLLM-Hook gates freeze once per request, at the end of the prompt",
              "pool the probe with prompt.mean or prompt.last, or use the steerc serve format "
              "(--target serve)"),
    cosine=yes("readout:cosine", "`cosine` (vLLM-Hook adds 1e-8 to the denominator: a rounding-level "
                                  "difference)"),
    projected_cosine=yes("readout:projected_cosine", "`projected_cosine` of one direction (CAST's "
                                                      "cos(h, tanh(P h)); vLLM-Hook's epsilons are a "
                                                      "rounding-level difference)"),
    schedule=no("op:schedule", "vLLM-Hook's strengths are constant: no transform varies with the "
                                "generation step", "drop the schedule, or " + "use the steerc serve format "
                                "(--target serve)"),
    subspace_cosine=no("readout:subspace_cosine", "vLLM-Hook's readouts have no untanh'd projection",
                        "read projected_cosine (CAST's condition), cosine or dot, or use the steerc serve "
                        "format (--target serve)"),
    dot=yes("readout:dot", "`affine` readout; the offset moves into the threshold"),
    norm=no("readout:norm", "vLLM-Hook has no norm readout",
             "read dot or cosine, or use the steerc serve format (--target serve)"),
    sae_feature=no("readout:sae_feature", "vLLM-Hook's readouts are linear or cosines: no SAE encoder",
                    "read the feature's direction with `dot(s[i])`, or use the steerc serve format "
                    "(--target serve)"),
    **{c.replace(":", "_"): no(c, "a vLLM-Hook intervention spec carries no output constraint",
                                "use the steerc serve format (--target serve), which sends it as "
                                "vLLM's structured-outputs fields")
       for c in ("constraint:json_schema", "constraint:regex", "constraint:grammar", "constraint:choice")},
    tensor=yes("parallel:tensor", "residual ops run on every rank; head sites need tensor parallel size 1 "
                                   "(vLLM-Hook refuses head_additive otherwise)"),
    pipeline=yes("parallel:pipeline", "each stage hooks the layers it owns"),
    per_request=no("param:per-request", "a vLLM-Hook intervention spec holds fixed values",
                    "compile one spec per value with --set, or use the steerc serve format "
                    "(--target serve), which takes each request's values"),
)

# vLLM-Hook's plugin places its own hooks: no steerc family table applies (backend None).
TARGET = Target("vllm-hook", "IBM vLLM-Hook's intervention spec", CAPABILITIES, emit, check=check,
                target="serve", dialect="vllm-hook", kernels=only("affine", "project", "rotate"))
